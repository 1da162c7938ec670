"""Console tracker: one readable line per step with the key metrics, the step out of the
run's total and an ETA; times with their unit (``step time 4.31 s``); and a warning for a step
whose every group gave its samples one and the same reward (``rollout/zero_variance_group_ratio``
1): group-relative advantages are then all 0 and the step learns nothing from its rewards.

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

    keys: list[str] = field(default_factory=lambda: list(DEFAULT_KEYS))  # metrics on the line, when logged
    every: int = 1  # print every N steps


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``: short enough for a log line."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def shown(key: str, value: float) -> str:
    """``reward_mean 0.5``, ``eval/correct_mean 0.9``, and a time with its unit: ``step time 4.31 s``."""
    if key.startswith("timing/"):
        return f"{key.split('/', 1)[-1]} time {value:.3g} s"
    name = key if key.startswith("eval/") else key.split("/", 1)[-1]
    return f"{name} {value:.4g}"


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
        if metrics.get("rollout/zero_variance_group_ratio") == 1.0:
            log.warning(f"step {step}: no learning signal: every group's samples got the same reward "
                        f"(reward_mean {metrics.get('rollout/reward_mean', float('nan')):.4g}), so every "
                        "group-relative advantage is 0; a task too easy or too hard for the model, or a "
                        "reward that does not tell answers apart")
        if step % self.params.every:
            return
        parts = [f"step {step}/{self.total}" if self.total is not None else f"step {step}"]
        for key in self.params.keys:
            if key in metrics:
                parts.append(shown(key, metrics[key]))
        if eta is not None and step < self.total:
            parts.append(f"eta {format_duration(eta)}")
        log.info(" | ".join(parts))
