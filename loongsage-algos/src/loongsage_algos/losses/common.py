"""Helpers shared by the policy losses: clamped ratios and per-sequence masked means."""

from __future__ import annotations

import torch

LOG_RATIO_CLAMP = 20.0


def clamp_log_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """Clamp a log-ratio to [−20, 20] before exp (verl and baidu-baige/LoongSage do the same)."""
    return log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def seq_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N] mean of ``values`` over each row's loss tokens (0 for an empty row)."""
    return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
