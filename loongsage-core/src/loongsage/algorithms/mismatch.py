"""Train–inference mismatch monitors, logged every step whatever the IS correction.

With Δ_t = log π_old − log π_roll on loss tokens (clamped to [−20, 20] as baidu-baige/LoongSage
does):

    train/is_approx_k3_kl       e^Δ − Δ − 1, the k3 estimate of KL(π_roll‖π_old)
    train/is_logprob_abs_diff   |Δ|

Both are reported as the **mean over the loss tokens of the mini-batch** (baidu-baige/LoongSage
returns the sum and divides by the token count later; we divide at once through the global token
count, so the numbers compare across batch sizes). Typical values: dense models 1e-5 to 1e-3, MoE
1e-3 to 1e-1 (zhaochenyang20/Awesome-ML-SYS-Tutorial, `rlhf/mismatch/blog-en.md`). Both are exactly
0 when the logprobs coincide.
"""

from __future__ import annotations

import torch

DELTA_CLAMP = 20.0


def log_mismatch(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor) -> torch.Tensor:
    """Δ = log π_old − log π_roll, detached and clamped to [−20, 20]."""
    return (old_logprobs.detach() - rollout_logprobs.detach()).clamp(-DELTA_CLAMP, DELTA_CLAMP)


def mismatch_metrics(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token monitor tensors [N, L]; the objective averages them over loss tokens."""
    delta = log_mismatch(old_logprobs, rollout_logprobs)
    return {
        "train/is_approx_k3_kl": torch.expm1(delta) - delta,
        "train/is_logprob_abs_diff": delta.abs(),
    }
