"""Rollout/training mismatch corrections: token, sequence and geometric IS weights.

With Δ_t = log π_old − log π_roll on loss tokens (clamped to [−20, 20]; baidu-baige/LoongSage
``apply_is_correction``), the importance weight π_old/π_roll at three levels:

    token      w_{i,t} = e^{Δ_{i,t}}
    sequence   w_i     = exp(Σ_t Δ_{i,t})              (whole-sequence ratio)
    geometric  w_i     = exp(mean_t Δ_{i,t})           (per-token geometric mean)

and two actions on the bounds [lower, upper]:

    clip   TIS (Yao et al., 2025; slime ``--use-tis``): weight clamp(w, lower, upper); a
           missing lower bound gives the classic one-sided min(w, C). Default upper C = 2.
    mask   MIS / rejection (arXiv 2512.23075; verl ``rollout_rs``): tokens or sequences with
           w outside [lower, upper] are dropped (keep = 0), the others weighted by w.

``icepop`` (Ring-1T, arXiv 2510.18855) is the token level with mask action and two-sided
bounds [0.5, 5] by default. The weight multiplies the policy loss of each token and carries
no gradient (decoupled correction; verl's *bypass* mode is the policy loss with
old_logprobs := rollout_logprobs instead, outside this module).

The bounds are compared in log space and a masked weight is selected away, never multiplied
by zero: a sequence's summed log-ratio passes 88 within a few extreme tokens, where
exp overflows float32 and ``inf · 0`` would make the whole loss NaN.

Deviation from baidu-baige/LoongSage: a masked token leaves the numerator only; the denominator
keeps counting it (``loongsage.algorithms.aggregation`` explains why). Metrics:
``train/is_weight_mean`` (mean applied weight over loss tokens) and ``train/is_clipfrac``
(fraction of loss tokens whose weight was clipped or masked).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from loongsage.plugin import Correction, PolicyLossInputs, log_mismatch
from loongsage_algos.params import IcePopParams, ISParams


def _token_log_weight(delta: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return delta


def _sequence_log_weight(delta: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (delta * mask).sum(-1, keepdim=True).expand_as(delta)


def _geometric_log_weight(delta: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mean = (delta * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
    return mean.expand_as(delta)


def _correct(inputs: PolicyLossInputs, params: ISParams, level: Callable) -> Correction:
    delta = log_mismatch(inputs.old_logprobs, inputs.rollout_logprobs)
    log_w = level(delta, inputs.mask)
    log_lower = -math.inf if not params.lower else math.log(params.lower)
    inside = (log_w >= log_lower) & (log_w <= math.log(params.upper))
    if params.action == "clip":
        weight, keep = torch.exp(log_w.clamp(log_lower, math.log(params.upper))), None
    else:
        keep = inside.to(inputs.mask.dtype)
        weight = torch.where(inside, torch.exp(torch.where(inside, log_w, 0.0)), 0.0)
    return Correction(
        weight=weight,
        keep=keep,
        metrics={"train/is_weight_mean": weight, "train/is_clipfrac": (~inside).to(inputs.mask.dtype)},
    )


def token_is(inputs: PolicyLossInputs, params: ISParams) -> Correction:
    """Token-level IS weight π_old/π_roll, clipped (TIS) or masked (MIS)."""
    return _correct(inputs, params, _token_log_weight)


def sequence_is(inputs: PolicyLossInputs, params: ISParams) -> Correction:
    """Sequence-level IS weight exp(Σ Δ), clipped or masked."""
    return _correct(inputs, params, _sequence_log_weight)


def geometric_is(inputs: PolicyLossInputs, params: ISParams) -> Correction:
    """Geometric-mean IS weight exp(mean Δ), clipped or masked."""
    return _correct(inputs, params, _geometric_log_weight)


def icepop(inputs: PolicyLossInputs, params: IcePopParams) -> Correction:
    """IcePop: token weights outside [0.5, 5] are masked, the rest kept with their weight."""
    return _correct(inputs, params, _token_log_weight)
