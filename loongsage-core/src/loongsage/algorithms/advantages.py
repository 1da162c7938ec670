"""Advantage estimation: the controller's entry point and core's ``grpo`` estimator.

``compute_advantages`` turns per-sample outcome rewards into per-token advantages [N, L]
with the estimator named by ``algorithm.advantage_estimator``. When ``algorithm.kl.use_as``
is ``reward`` (and the coefficient is > 0) the KL policy's detached value is subtracted per
token first, β·KL_t (verl ``apply_kl_penalty``): outcome estimators see
r_i − β Σ_t KL_{i,t}, token-return estimators see the per-token penalty.

``grpo`` (DeepSeekMath, arXiv 2402.03300; modes as baidu-baige/LoongSage ``advantage_norm_mode``),
with group g of sample i, μ/σ the mean and standard deviation:

    group_zscore   (r_i − μ_g) / (σ_g + ε)
    group_mean     r_i − μ_g
    batch_zscore   (r_i − μ_B) / (σ_B + ε)        over every sample of the step
    batch_mean     r_i − μ_B
    none           r_i

σ is Bessel-corrected by default (torch.std, as verl and baidu-baige/LoongSage). A group holding a
single sample gets Â = 0 in the group modes (baidu-baige/LoongSage, verl ``rloo_vectorized``): a
lone sample carries no relative signal; verl's ``grpo`` would give r/(1+ε) instead. Deviation:
baidu-baige/LoongSage uses rsqrt(var + ε) for batch_zscore; we use σ + ε in both z-score modes. The
scalar is broadcast over the row's loss tokens (zero elsewhere).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from loongsage.algorithms.params import GRPOParams
from loongsage.algorithms.types import AdvantageInputs
from loongsage.algorithms.validate import AlgorithmSpec


def group_stats(values: torch.Tensor, group_ids: torch.Tensor, unbiased: bool = True):
    """Per-sample group mean, group std and group size, each [N]."""
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    counts_f = counts.to(values.dtype)
    sums = torch.zeros_like(counts_f).scatter_add_(0, inverse, values)
    mean = (sums / counts_f)[inverse]
    sq = torch.zeros_like(counts_f).scatter_add_(0, inverse, (values - mean) ** 2)
    dof = (counts_f - 1.0).clamp(min=1.0) if unbiased else counts_f
    std = (sq / dof).sqrt()[inverse]
    return mean, std, counts[inverse]


def broadcast(scalar: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Spread a per-sample value [N] over the row's loss tokens [N, L]."""
    return scalar.to(mask.dtype).unsqueeze(-1) * mask


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x − mean) / sqrt(var + eps) over masked entries (Bessel-corrected var), zero elsewhere."""
    n = mask.sum()
    mean = (values * mask).sum() / n.clamp(min=1.0)
    var = (((values - mean) * mask) ** 2).sum() / (n - 1.0).clamp(min=1.0)
    return (values - mean) * torch.rsqrt(var + eps) * mask


def grpo_advantage(inputs: AdvantageInputs, params: GRPOParams) -> torch.Tensor:
    """GRPO outcome advantage with group/batch z-score or mean-centring."""
    r = inputs.rewards.to(inputs.mask.dtype)
    mode = params.norm_mode
    if mode == "none":
        return broadcast(r, inputs.mask)
    if mode.startswith("group"):
        mean, std, size = group_stats(r, inputs.group_ids, params.std_unbiased)
        adv = r - mean
        if mode == "group_zscore":
            adv = adv / (std + params.eps)
        return broadcast(torch.where(size > 1, adv, torch.zeros_like(adv)), inputs.mask)
    adv = r - r.mean()
    if mode == "batch_zscore":
        std = r.std(unbiased=params.std_unbiased) if r.numel() > 1 else torch.zeros(())
        adv = adv / (std + params.eps)
    return broadcast(adv, inputs.mask)


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """[N] index of each row's last loss token (0 for a row without any)."""
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    return torch.where(mask > 0, positions, torch.zeros_like(positions)).max(-1).values


def build_inputs(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    mask: torch.Tensor,
    token_penalty: torch.Tensor | None = None,
) -> AdvantageInputs:
    """Place each outcome reward on its row's last loss token and subtract a token penalty."""
    token_rewards = torch.zeros_like(mask)
    has_tokens = mask.sum(-1) > 0
    rows = torch.arange(mask.shape[0], device=mask.device)
    token_rewards[rows, last_token_index(mask)] = torch.where(
        has_tokens, rewards.to(mask.dtype), torch.zeros_like(rewards, dtype=mask.dtype)
    )
    if token_penalty is not None:
        token_rewards = token_rewards - token_penalty.detach() * mask
    total = torch.where(has_tokens, token_rewards.sum(-1), rewards.to(mask.dtype))
    return AdvantageInputs(total, token_rewards, group_ids, mask)


def _as_tensor(values: Any, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        return values.detach().to(dtype)
    return torch.as_tensor(list(values), dtype=dtype)


def advantage_inputs(
    rewards: torch.Tensor | Sequence[float],
    group_ids: torch.Tensor | Sequence[int],
    loss_mask: torch.Tensor,
    spec: AlgorithmSpec,
    *,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
) -> AdvantageInputs:
    """What the estimator of ``spec`` sees: the outcome reward on each row's last loss token, a
    KL reward penalty per token when configured, the per-token values (``compute_advantages``)."""
    mask = loss_mask.detach().float()
    rewards_t = _as_tensor(rewards, mask.dtype)
    groups_t = _as_tensor(group_ids, torch.long)
    if rewards_t.shape != (mask.shape[0],) or groups_t.shape != (mask.shape[0],):
        raise ValueError(
            f"compute_advantages: rewards {tuple(rewards_t.shape)} and group_ids "
            f"{tuple(groups_t.shape)} must both be [N] with N = {mask.shape[0]} rows of loss_mask"
        )
    penalty = None
    if spec.kl_as_reward:
        if old_logprobs is None or ref_logprobs is None:
            raise ValueError(
                "compute_advantages: algorithm.kl.use_as=reward with coef > 0 needs "
                "old_logprobs and ref_logprobs [N, L]"
            )
        penalty = spec.kl_coef * spec.kl_fn(old_logprobs.detach().float(), ref_logprobs.detach().float())
    if spec.advantage.flag("needs_values") and values is None:
        raise ValueError(f"compute_advantages: estimator '{spec.advantage.name}' needs per-token "
                         "values [N, L]")
    inputs = build_inputs(rewards_t, groups_t, mask, penalty)
    inputs.values = None if values is None else values.detach().to(mask.dtype)
    return inputs


def compute_advantages(
    rewards: torch.Tensor | Sequence[float],
    group_ids: torch.Tensor | Sequence[int],
    loss_mask: torch.Tensor,
    spec: AlgorithmSpec,
    **tensors: torch.Tensor | None,
) -> torch.Tensor:
    """Per-token advantages [N, L] (zero outside ``loss_mask``) for one training step.

    ``rewards`` [N] outcome rewards, ``group_ids`` [N] prompt-group ids, ``loss_mask``
    [N, L], ``spec`` the resolved ``algorithm`` section (the objective's). ``tensors`` are
    ``advantage_inputs``' keywords, each [N, L]: ``old_logprobs`` and ``ref_logprobs``,
    required only when ``algorithm.kl.use_as == "reward"`` with ``coef > 0``, and ``values``
    (a per-token baseline), required by an estimator with ``needs_values`` (``gae``).
    """
    inputs = advantage_inputs(rewards, group_ids, loss_mask, spec, **tensors)
    advantages = spec.advantage.obj(inputs, spec.advantage.params)
    return advantages * inputs.mask
