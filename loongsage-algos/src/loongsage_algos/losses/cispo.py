"""CISPO (MiniMax-M1, arXiv 2506.13585, Eq. 4–5; slime ``compute_cispo_loss``).

    ℓ_t = −sg(clip(ρ_t, 1−ε_low, 1+ε_high))·Â_t·log π_θ(y_t),   ρ_t = π_θ/π_old

Unlike PPO-clip, a clipped token keeps its gradient: only its importance weight is capped.
The paper uses no lower bound in practice and tunes ε_high; our defaults are ε_low = 1
(lower bound 0, i.e. none) and ε_high = 0.28 (DAPO's clip-higher value; the paper does not
print its value). With ``token_mean`` aggregation this is the paper's 1/Σ|o_i|
normalisation. The loss *value* is not a meaningful objective (it contains log π_θ); its
gradient is. Metric ``train/cispo_clipfrac``: tokens whose weight was capped.
"""

from __future__ import annotations

import torch

from loongsage.plugin import PolicyLossInputs, PolicyLossOutput
from loongsage_algos.losses.common import clamp_log_ratio
from loongsage_algos.params import CISPOParams


def cispo_loss(inputs: PolicyLossInputs, params: CISPOParams) -> PolicyLossOutput:
    """CISPO: clipped, detached IS weight times Â·log π_θ."""
    ratio = torch.exp(clamp_log_ratio(inputs.logprobs - inputs.old_logprobs)).detach()
    low, high = 1.0 - params.eps_low, 1.0 + params.eps_high
    weight = ratio.clamp(low, high)
    capped = ((ratio < low) | (ratio > high)).float()
    return PolicyLossOutput(
        loss=-weight * inputs.advantages * inputs.logprobs,
        metrics={"train/cispo_clipfrac": capped, "train/ratio_mean": ratio},
    )
