"""The tracker contract: built as ``cls(params, run_dir, config)``; ``log`` per step; ``close``;
``log_samples`` every ``logging.tracker_samples_every`` steps.

Metric names follow ``section/name`` (``rollout/reward_mean``, ``timing/step``). Trackers
only receive plain floats and ints; the controller has already reduced tensors. Samples are
rows of ``SAMPLE_COLUMNS`` (a step's saved trajectories as text, with their rewards), as TRL
logs its completions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping


SAMPLE_COLUMNS = ("step", "source", "group_id", "prompt", "response", "ground_truth", "reward", "advantage")


def sample_rows(samples: list[dict]) -> list[list]:
    """``SAMPLE_COLUMNS`` of saved samples (``samples/step_*.jsonl`` rows): text, the ground truth
    as text, the reward and the mean advantage over the response (None where none was computed)."""
    rows = []
    for s in samples:
        advantages = [a for a in s.get("advantages") or [] if a is not None]
        advantage = sum(advantages) / len(advantages) if advantages else None
        rows.append([s["step"], s["source"], s["group_id"], s["prompt"], s["response"],
                     str(s.get("ground_truth")), s["reward"], advantage])
    return rows


class Tracker:
    """Base class for trackers; subclasses override ``log`` and optionally ``close``."""

    def __init__(self, params: Any, run_dir: Path, config: Mapping[str, Any]) -> None:
        self.params = params
        self.run_dir = Path(run_dir)
        self.config = config

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        raise NotImplementedError

    def log_samples(self, rows: list[list], step: int) -> None:
        """A step's sample completions, rows of ``SAMPLE_COLUMNS``; trackers without a place for
        them leave this as is."""

    def close(self) -> None:
        """Flush and release resources."""
