"""GSPO and GSPO-token (Zheng et al., "Group Sequence Policy Optimization", arXiv 2507.18071).

Sequence ratio s_i = (π_θ(y_i)/π_old(y_i))^{1/|y_i|} = exp(mean_t log ρ_{i,t}) over the row's
loss tokens, and the sequence advantage Â_i = mean_t Â_{i,t} (outcome estimators give every
token the same value):

    gspo        ℓ_{i,t} = −min(s_i·Â_i, clip(s_i, 1−ε_low, 1+ε_high)·Â_i)   for every token t
    gspo_token  s_{i,t} = sg[s_i]·π_θ(y_{i,t})/sg[π_θ(y_{i,t})]  (value s_i, gradient of one token)
                ℓ_{i,t} = −min(s_{i,t}·Â_{i,t}, clip(s_{i,t}, 1−ε_low, 1+ε_high)·Â_{i,t})

The paper's objective is (1/G)Σ_i of the sequence term, i.e. ``seq_mean_token_mean``
aggregation (a constant per-token loss averaged over the row); with that mode and a
constant advantage per row both losses are equal in value and in gradient. Paper
defaults ε_low = 3e-4, ε_high = 4e-4. log s_i is clamped to [−20, 20] (verl clamps at 10).
Metric ``train/gspo_clipfrac`` is the fraction of sequences (gspo) or tokens (gspo_token)
whose clipped term is active.
"""

from __future__ import annotations

import torch

from loongsage.plugin import PolicyLossInputs, PolicyLossOutput
from loongsage_algos.losses.common import clamp_log_ratio, seq_mean
from loongsage_algos.params import GSPOParams, GSPOTokenParams


def _clipped_objective(ratio: torch.Tensor, adv: torch.Tensor, params: GSPOParams):
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - params.eps_low, 1.0 + params.eps_high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).float()


def _log_seq_ratio(inputs: PolicyLossInputs) -> torch.Tensor:
    return clamp_log_ratio(seq_mean(inputs.logprobs - inputs.old_logprobs, inputs.mask))


def gspo_loss(inputs: PolicyLossInputs, params: GSPOParams) -> PolicyLossOutput:
    """GSPO: sequence-level ratio and advantage, clipped per sequence."""
    log_s = _log_seq_ratio(inputs)
    adv = seq_mean(inputs.advantages, inputs.mask)
    loss, clipped = _clipped_objective(torch.exp(log_s), adv, params)
    return PolicyLossOutput(
        loss=loss.unsqueeze(-1).expand_as(inputs.logprobs),
        metrics={"train/gspo_clipfrac": clipped.detach(), "train/gspo_seq_ratio": torch.exp(log_s).detach()},
    )


def gspo_token_loss(inputs: PolicyLossInputs, params: GSPOTokenParams) -> PolicyLossOutput:
    """GSPO-token: value of the sequence ratio, per-token gradient and advantages."""
    log_s = _log_seq_ratio(inputs).detach().unsqueeze(-1)
    log_token = log_s + inputs.logprobs - inputs.logprobs.detach()
    loss, clipped = _clipped_objective(torch.exp(log_token), inputs.advantages, params)
    return PolicyLossOutput(
        loss=loss,
        metrics={"train/gspo_clipfrac": clipped.detach(), "train/gspo_seq_ratio": torch.exp(log_s.squeeze(-1))},
    )
