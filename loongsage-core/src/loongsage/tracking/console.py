"""Console tracker: one readable line per step with the key metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from loongsage.tracking.base import Tracker

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


class ConsoleTracker(Tracker):
    """Print the selected metrics once every ``every`` steps (tqdm-safe)."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if step % self.params.every:
            return
        from tqdm import tqdm

        parts = [f"step {step}"]
        for key in self.params.keys:
            if key in metrics:
                name = key if key.startswith("eval/") else key.split("/", 1)[-1]
                parts.append(f"{name} {metrics[key]:.4g}")
        tqdm.write(" | ".join(parts))
