"""Console tracker: one readable line per step with the key metrics, the step out of the
run's total and an ETA.

Lines go through the ``loongsage.console`` logger (so ``-q`` silences them and a tqdm bar,
when one is shown, is redrawn below them). The ETA is the mean wall time of the steps this
process has logged so far times the steps left (``trainer.steps`` of the run's config), so
a resumed run estimates from its own pace.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Mapping

from loongsage.tracking.base import Tracker

log = logging.getLogger("loongsage.console")

DEFAULT_KEYS = [
    "rollout/reward_mean",
    "rollout/response_length_mean",
    "train/loss",
    "train/grad_norm",
    "train/is_approx_k3_kl",
    "timing/step",
    "eval/reward_mean",
    "eval/correct_mean",
]


@dataclass
class ConsoleParams:
    """Print one line per step with the key metrics."""

    keys: list[str] = field(default_factory=lambda: list(DEFAULT_KEYS))
    every: int = 1


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``: short enough for a log line."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class ConsoleTracker(Tracker):
    """Log the selected metrics once every ``every`` steps as ``step i/N | ... | eta 1m05s``."""

    def __init__(self, params, run_dir, config) -> None:
        super().__init__(params, run_dir, config)
        self.total = (config.get("trainer") or {}).get("steps")
        self._start: float | None = None
        self._first_step: int | None = None

    def eta(self, step: int) -> float | None:
        """Seconds left after ``step``, from the pace of the steps logged so far."""
        now = time.monotonic()
        if self._start is None:
            self._start, self._first_step = now, step
            return None
        done = step - self._first_step
        if self.total is None or done <= 0:
            return None
        return (now - self._start) / done * max(0, self.total - 1 - step)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        eta = self.eta(step)
        if step % self.params.every:
            return
        parts = [f"step {step}/{self.total}" if self.total is not None else f"step {step}"]
        for key in self.params.keys:
            if key in metrics:
                name = key if key.startswith("eval/") else key.split("/", 1)[-1]
                parts.append(f"{name} {metrics[key]:.4g}")
        if eta is not None and step < self.total:
            parts.append(f"eta {format_duration(eta)}")
        log.info(" | ".join(parts))
