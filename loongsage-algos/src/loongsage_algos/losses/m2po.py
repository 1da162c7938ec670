"""M2PO: second-moment trust policy optimisation (Zheng, Zhao, Chen, arXiv 2510.01161).

With log r_t = log π_old − log π_roll on the loss tokens (detached; LS-ref
``apply_m2po_masking``), sort (log r)² in descending order and mask the smallest prefix k
of the largest values that brings the mean of the rest to ≤ τ (``threshold``, default
0.04). If no prefix does, keep only the single smallest token (LS-ref's fallback). Then

    ℓ_t = −M_t·(π_θ/π_roll)_t·Â_t        (no clipping)

and with ``token_mean`` aggregation the denominator is all loss tokens Σ|o_i|, masked ones
included (the paper's 1/Σ|o_i|).

Sources and deviations: the ratio in the objective is π_θ/π_roll, the paper's behaviour
policy ratio, so M2PO itself corrects the rollout/training mismatch; that is why it may
not be combined with an IS correction (``validate_algorithm``). AReaL measures log r as
log π_behav − log π_prox instead (the same quantity in its decoupled-PPO terms). The
second moment is computed over the tokens this call sees: the micro-batch (LS-ref computes
it per micro-batch too). With ``micro_batch_size`` ≥ the mini-batch it is the paper's batch
statistic; with smaller micro-batches the mask, unlike the aggregation, depends on the split.

Metrics: ``train/m2po_masked_frac`` (tokens masked), ``train/m2po_second_moment`` (mean of
(log r)² before masking) and ``train/m2po_fallback`` (1 when the fallback was used).
"""

from __future__ import annotations

import torch

from loongsage.algorithms.mismatch import log_mismatch
from loongsage.algorithms.types import PolicyLossInputs, PolicyLossOutput
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


def m2po_loss(inputs: PolicyLossInputs, params: M2POParams) -> PolicyLossOutput:
    """M2PO: second-moment masking of π_θ/π_roll-weighted advantages, no clipping."""
    sq = log_mismatch(inputs.old_logprobs, inputs.rollout_logprobs).square()
    keep, fallback = m2po_keep_mask(sq, inputs.mask, params.threshold)
    ratio = torch.exp(clamp_log_ratio(inputs.logprobs - inputs.rollout_logprobs))
    flag = torch.full_like(inputs.mask[:, 0], float(fallback))
    return PolicyLossOutput(
        loss=-ratio * inputs.advantages,
        keep=keep,
        metrics={
            "train/m2po_masked_frac": (1.0 - keep) * inputs.mask,
            "train/m2po_second_moment": sq,
            "train/m2po_fallback": flag,
            "train/ratio_mean": ratio.detach(),
        },
    )
