"""M2PO: second-moment trust policy optimisation (Zheng, Zhao, Chen, arXiv 2510.01161).

With log r_t = log π_old − log π_roll on the loss tokens (detached; baidu-baige/LoongSage
``apply_m2po_masking``), sort (log r)² in descending order and mask the smallest prefix k
of the largest values that brings the mean of the rest to ≤ τ (``threshold``, default
0.04). If no prefix does, keep only the single smallest token (baidu-baige/LoongSage's fallback).
Then

    ℓ_t = −M_t·(π_θ/π_roll)_t·Â_t        (no clipping)

and with ``token_mean`` aggregation the denominator is all loss tokens Σ|o_i|, masked ones
included (the paper's 1/Σ|o_i|).

Sources and deviations: the ratio in the objective is π_θ/π_roll, the paper's behaviour
policy ratio, so M2PO itself corrects the rollout/training mismatch; that is why it may
not be combined with an IS correction (``validate_algorithm``). AReaL measures log r as
log π_behav − log π_prox instead (the same quantity in its decoupled-PPO terms).

The second moment is a statistic of the whole batch (baidu-baige/LoongSage masks "across the whole
batch"). ``m2po_prepare`` computes the mask once on the full mini-batch (called through
``Objective.prepare``) and stores it as ``extras["m2po_keep"]``, so the mask does not depend
on the micro-batch split. Called without that preparation (a bare loss call), the loss
computes the mask over the tokens it is given.

Metrics: ``train/m2po_masked_frac`` (tokens masked), ``train/m2po_second_moment`` (mean of
(log r)² before masking) and ``train/m2po_fallback`` (1 when the fallback was used).
"""

from __future__ import annotations

import torch

from loongsage.plugin import PolicyLossInputs, PolicyLossOutput, log_mismatch
from loongsage_algos.losses.common import clamp_log_ratio
from loongsage_algos.params import M2POParams


def m2po_keep_mask(sq_log_ratio: torch.Tensor, mask: torch.Tensor, threshold: float) -> tuple[torch.Tensor, bool]:
    """Keep mask [N, L] leaving the kept tokens' mean ≤ threshold, and whether it fell back."""
    valid = mask > 0
    values = sq_log_ratio[valid]
    keep = torch.zeros_like(mask)
    n = values.numel()
    if n == 0:
        return keep, False
    order = torch.sort(values, descending=True, stable=True).indices
    sorted_vals = values[order]
    suffix_sum = torch.flip(torch.cumsum(torch.flip(sorted_vals, [0]), 0), [0])
    suffix_mean = suffix_sum / torch.arange(n, 0, -1, dtype=values.dtype, device=values.device)
    ok = (suffix_mean <= threshold).nonzero()
    fallback = ok.numel() == 0
    k = n - 1 if fallback else int(ok[0])
    kept_flat = torch.zeros(n, dtype=mask.dtype, device=mask.device)
    kept_flat[order[k:]] = 1.0
    keep[valid] = kept_flat
    return keep, fallback


M2PO_KEEP = "m2po_keep"
M2PO_FALLBACK = "m2po_fallback"


def _mask_from_inputs(inputs: PolicyLossInputs, params: M2POParams) -> dict[str, torch.Tensor]:
    sq = log_mismatch(inputs.old_logprobs, inputs.rollout_logprobs).square()
    keep, fallback = m2po_keep_mask(sq, inputs.mask, params.threshold)
    return {M2PO_KEEP: keep, M2PO_FALLBACK: torch.full_like(inputs.mask[:, 0], float(fallback))}


def m2po_prepare(inputs: PolicyLossInputs, params: M2POParams) -> dict[str, torch.Tensor]:
    """The batch-level keep mask [N, L] and fallback flag [N], computed once per mini-batch."""
    return _mask_from_inputs(inputs, params)


def m2po_loss(inputs: PolicyLossInputs, params: M2POParams) -> PolicyLossOutput:
    """M2PO: second-moment masking of π_θ/π_roll-weighted advantages, no clipping."""
    prepared = inputs.extras if M2PO_KEEP in inputs.extras else _mask_from_inputs(inputs, params)
    keep = prepared[M2PO_KEEP].to(inputs.mask.dtype)
    sq = log_mismatch(inputs.old_logprobs, inputs.rollout_logprobs).square()
    ratio = torch.exp(clamp_log_ratio(inputs.logprobs - inputs.rollout_logprobs))
    return PolicyLossOutput(
        loss=-ratio * inputs.advantages,
        keep=keep,
        metrics={
            "train/m2po_masked_frac": (1.0 - keep) * inputs.mask,
            "train/m2po_second_moment": sq,
            "train/m2po_fallback": prepared[M2PO_FALLBACK].to(inputs.mask.dtype),
            "train/ratio_mean": ratio.detach(),
        },
    )


m2po_loss.prepare = m2po_prepare  # type: ignore[attr-defined]
