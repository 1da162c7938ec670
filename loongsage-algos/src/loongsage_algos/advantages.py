"""Advantage estimators beyond core's ``grpo``: Dr. GRPO, RLOO, REINFORCE++ (+ baseline).

Each maps ``AdvantageInputs`` (outcome rewards r_i, KL-shaped token rewards, group ids,
loss mask) to per-token advantages [N, L], zero outside the loss mask. With g the group of
sample i, G its size and μ_g its mean reward:

    dr_grpo                       Â_i = r_i − μ_g                      (arXiv 2503.20783)
    rloo                          Â_i = r_i − mean_{j≠i} r_j = G/(G−1)·(r_i − μ_g)
                                                                       (arXiv 2402.14740)
    reinforce_plus_plus           R_t = Σ_{s≥t} γ^{s−t} r_s on the token rewards (outcome at
                                  the last loss token, −β·KL_t per token when kl.use_as is
                                  reward), Â = whiten(R) over all loss tokens of the batch
                                  (arXiv 2501.03262)
    reinforce_plus_plus_baseline  Â_{i,t} = whiten(r_i − μ_g) over all loss tokens of the
                                  batch (same paper; verl ``reinforce_plus_plus_baseline``)

Singleton groups get Â = 0 before whitening in the group-relative estimators (verl
``rloo_vectorized``, baidu-baige/LoongSage; verl ``rloo`` would return r). Whitening is
(x − mean)/sqrt(var + 1e-8) with Bessel-corrected variance over masked tokens, as verl's
``masked_whiten``; Dr. GRPO's length normalisation lives in the loss aggregation
(``seq_mean_token_sum_norm``), not here.
"""

from __future__ import annotations

import torch

from loongsage.plugin import AdvantageInputs, broadcast, group_stats, masked_whiten
from loongsage_algos.params import (
    DrGRPOParams,
    ReinforcePPBaselineParams,
    ReinforcePPParams,
    RLOOParams,
)


def _centred(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    r = inputs.rewards.to(inputs.mask.dtype)
    mean, _, size = group_stats(r, inputs.group_ids)
    return torch.where(size > 1, r - mean, torch.zeros_like(r)), size


def dr_grpo_advantage(inputs: AdvantageInputs, params: DrGRPOParams) -> torch.Tensor:
    """Dr. GRPO: r − group mean."""
    centred, _ = _centred(inputs)
    return broadcast(centred, inputs.mask)


def rloo_advantage(inputs: AdvantageInputs, params: RLOOParams) -> torch.Tensor:
    """RLOO: leave-one-out baseline, G/(G−1)·(r − group mean)."""
    centred, size = _centred(inputs)
    g = size.to(centred.dtype)
    scale = torch.where(size > 1, g / (g - 1.0).clamp(min=1.0), torch.zeros_like(g))
    return broadcast(centred * scale, inputs.mask)


def reinforce_pp_advantage(inputs: AdvantageInputs, params: ReinforcePPParams) -> torch.Tensor:
    """REINFORCE++: whitened discounted returns of the token rewards."""
    mask = inputs.mask
    rewards = inputs.token_rewards * mask
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[-1])):
        # padding (mask 0) neither adds reward nor discounts what comes after it
        running = torch.where(mask[:, t] > 0, rewards[:, t] + params.gamma * running, running)
        returns[:, t] = running
    return masked_whiten(returns, mask)


def reinforce_pp_baseline_advantage(
    inputs: AdvantageInputs, params: ReinforcePPBaselineParams
) -> torch.Tensor:
    """REINFORCE++-baseline: group-mean baseline, then batch-wide token whitening."""
    centred, _ = _centred(inputs)
    return masked_whiten(broadcast(centred, inputs.mask), inputs.mask)
