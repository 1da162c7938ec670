"""SAO's policy loss (Single-rollout Asynchronous Optimization, Hou, Li, Tang, Dong,
arXiv 2607.07508): the ratio against the *rollout* policy, strictly masked on both sides.

    r_t = π_θ / π_roll                    (no π_old: the rollout policy is the behaviour policy)
    m_t = 1[1 − ε_low ≤ r_t ≤ 1 + ε_high]  (computed on the detached ratio)
    ℓ_t = −m_t · r_t · Â_t

A token outside the trust region is dropped entirely (no value, no gradient), where PPO-clip
would keep it with a clipped ratio; the aggregation's denominators keep counting it, so with
``token_mean`` this is the paper's (1/|τ|)·Σ m_t·r_t·Â_t. The bounds are compared in log
space and a masked token is selected away, never multiplied by zero, so log-ratios of ±1000
give a finite loss and gradient (log r is clamped to [−20, 20] before exp). The KL term
−β·KL(π_θ‖π_ref) is the objective's (``algorithm.kl``). Because r_t already uses π_roll, the
loss is flagged ``uses_rollout_ratio``: an IS correction by π_old/π_roll on top would
correct the same mismatch twice and is refused. Defaults ε_low = 0.2, ε_high = 0.28 are
ours (PPO-clip's, DAPO clip-higher); the paper's values are not in our reference.
Metrics: ``train/sao_maskfrac`` (loss tokens dropped), ``train/ratio_mean`` (r_t).
"""

from __future__ import annotations

import math

import torch

from loongsage.plugin import PolicyLossInputs, PolicyLossOutput
from loongsage_algos.losses.common import clamp_log_ratio
from loongsage_algos.params import SAOParams


def sao_loss(inputs: PolicyLossInputs, params: SAOParams) -> PolicyLossOutput:
    """−m·r·Â with r = π_θ/π_roll and m the strict double-sided token mask."""
    log_ratio = clamp_log_ratio(inputs.logprobs - inputs.rollout_logprobs)
    detached = log_ratio.detach()
    low = math.log(1.0 - params.eps_low) if params.eps_low < 1 else -math.inf
    inside = (detached >= low) & (detached <= math.log1p(params.eps_high))
    ratio = torch.exp(log_ratio)
    loss = torch.where(inside, -ratio * inputs.advantages, torch.zeros_like(ratio))
    keep = inside.to(inputs.mask.dtype)
    return PolicyLossOutput(
        loss=loss,
        keep=keep,
        metrics={"train/sao_maskfrac": 1.0 - keep, "train/ratio_mean": ratio.detach()},
    )
