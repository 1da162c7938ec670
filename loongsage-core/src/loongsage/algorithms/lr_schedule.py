"""Learning-rate schedules: a linear warm-up, then a decay to zero over the remaining steps.

Used by the supervised warm start (``trainer.sft.warmup_steps`` / ``trainer.sft.lr_decay``).
A decay matters most for small models trained at a high rate: at a constant rate the noise of
the last few batches decides what the warm-started model does, so two runs that differ only
in float summation order (another CPU, another thread count) can end far apart.
"""

from __future__ import annotations

import math
from typing import Callable

LR_DECAYS: dict[str, Callable[[float], float]] = {
    "constant": lambda progress: 1.0,
    "linear": lambda progress: 1.0 - progress,
    "cosine": lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress)),
}


def learning_rate(step: int, steps: int, lr: float, warmup_steps: int = 0, decay: str = "constant",
                  key: str = "lr_decay") -> float:
    """The rate of step ``step`` (0-based) of ``steps``: ``lr * (step + 1) / warmup_steps``
    during the warm-up, then ``lr * LR_DECAYS[decay](progress)`` with progress going from 0 at
    the first step after the warm-up to ``1 - 1 / (steps - warmup_steps)`` at the last (so the
    last step still trains). ``key`` names the config field in the error for an unknown decay."""
    if decay not in LR_DECAYS:
        raise ValueError(f"{key}: expected one of {sorted(LR_DECAYS)}, got {decay!r}")
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    return lr * LR_DECAYS[decay]((step - warmup_steps) / max(1, steps - warmup_steps))
