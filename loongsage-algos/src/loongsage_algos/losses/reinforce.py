"""REINFORCE with an importance ratio and no clipping.

    ℓ_t = −ρ_t·Â_t,   ρ_t = π_θ/π_old   (log ρ clamped to [−20, 20])

Its gradient −ρ_t·Â_t·∇log π_θ equals the vanilla REINFORCE gradient −Â_t·∇log π_θ on
policy (ρ = 1) and stays an unbiased importance-weighted estimate on later mini-batches of
the same rollout batch. Used as the unclipped baseline against PPO-clip; the value is −Â
on policy.
"""

from __future__ import annotations

import torch

from loongsage.plugin import PolicyLossInputs, PolicyLossOutput
from loongsage_algos.losses.common import clamp_log_ratio
from loongsage_algos.params import ReinforceParams


def reinforce_loss(inputs: PolicyLossInputs, params: ReinforceParams) -> PolicyLossOutput:
    """REINFORCE: −ρ·Â without clipping."""
    ratio = torch.exp(clamp_log_ratio(inputs.logprobs - inputs.old_logprobs))
    return PolicyLossOutput(loss=-ratio * inputs.advantages, metrics={"train/ratio_mean": ratio.detach()})
