"""An IS correction: the per-token weight π_old/π_roll, detached and capped from above
(truncated importance sampling, Ionides 2008), for the rollout/training mismatch."""

import torch

from loongsage.plugin import Correction, log_mismatch


def token_cap(inputs, params):
    weight = torch.exp(log_mismatch(inputs.old_logprobs, inputs.rollout_logprobs)).clamp(max=params.cap)
    return Correction(weight=weight, metrics={"train/is_capped_frac": (weight >= params.cap).float()})
