"""Training from a recording: ``rollout.from_recording=RUN`` trains on the batches another run
recorded (``rollout.record=true``, ``controller.recording``) and starts no rollout engine, no
router and no reward worker, to debug or benchmark the trainer alone.

Step ``s`` trains on the recording's step ``s``, groups in the recorded order, rewards as
recorded. Only the first step starts from the weights that sampled its batch (when the runs
start from the same weights): afterwards this run's weights are its own, not those that
sampled the recorded tokens, so the importance ratios and mismatch metrics measure the gap
between the two; every step logs ``rollout/from_recording`` = 1 so a plot or a reader of
``metrics.jsonl`` can tell such a run from one that generated its data (as verl's and
ROLL's trainers on offline data do not).
"""

from __future__ import annotations

import logging
from pathlib import Path

from loongsage.controller.recording import load_batch, recorded_steps
from loongsage.data.types import Group

log = logging.getLogger(__name__)


def check_recording(path: str | Path, steps: int, eval_interval: int = 0) -> Path:
    """The recorded run's directory, once it holds a batch for every step ``0 .. steps - 1``
    (and the run asks for no evaluation, which would need an engine)."""
    if eval_interval > 0:
        raise ValueError(f"rollout.from_recording={path} with trainer.eval_interval={eval_interval}: evaluation "
                         "generates, and a run trained from a recording starts no engine; set trainer.eval_interval=0")
    folder = Path(path)
    have = recorded_steps(folder) if folder.is_dir() else []
    missing = sorted(set(range(steps)) - set(have))
    if missing:
        held = f"steps {have[0]}..{have[-1]} ({len(have)} batches)" if have else "no recorded batch"
        raise ValueError(f"rollout.from_recording={path}: trainer.steps={steps} needs the recorded batches of "
                         f"steps 0..{steps - 1}; it holds {held} (record a run with rollout.record=true)")
    return folder


class RecordedBatches:
    """The scheduler of a run trained from a recording: step ``s`` is the recording's step ``s``."""

    def __init__(self, recording: Path) -> None:
        self.recording = recording
        self.version = 0

    def next_batch(self, step: int) -> list[Group]:
        return load_batch(self.recording, step)

    def pause(self) -> None:
        """Nothing generates."""

    def on_weights_updated(self, version: int) -> None:
        self.version = version

    def metrics(self) -> dict[str, float]:
        return {"rollout/from_recording": 1.0}

    def state_dict(self) -> dict:
        return {"version": self.version}

    def load_state_dict(self, state: dict) -> None:
        self.version = state["version"]

    def close(self) -> None:
        """Nothing runs in the background."""


class RecordedRollout:
    """What the step loop asks the rollout side for, when the rollout is a recording: the
    rewards were scored when it was recorded and no engine or agent runs, so nothing is counted."""

    def reward_metrics(self) -> dict[str, float]:
        return {}

    def engine_metrics(self) -> dict[str, float]:
        return {}

    def failure_metrics(self) -> dict[str, float]:
        return {}
