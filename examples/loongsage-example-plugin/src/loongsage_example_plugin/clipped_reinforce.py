"""A policy loss: REINFORCE weighted by the importance ratio π_θ/π_old, detached and capped
from above (as CISPO caps it, arXiv:2506.13585), so off-policy tokens still get a gradient."""

import torch

from loongsage.plugin import PolicyLossOutput


def clipped_reinforce(inputs, params):
    """loss_t = −min(ratio_t, cap) · Â_t · log π_θ(t), the ratio detached."""
    ratio = torch.exp(inputs.logprobs.detach() - inputs.old_logprobs)
    capped = ratio.clamp(max=params.ratio_cap)
    loss = -capped * inputs.advantages * inputs.logprobs
    return PolicyLossOutput(loss, metrics={"train/ratio_capped_frac": (ratio > params.ratio_cap).float()})
