"""Loss aggregation with global denominators (verl ``verl/trainer/ppo/core_algos.py::agg_loss``).

A train engine calls the loss once per micro-batch and sums the results, so every mode
here divides by counts of the *whole* mini-batch (``LossContext.global_num_tokens`` /
``global_num_seqs``, summed over micro-batches and data-parallel ranks). The sum over
micro-batches then equals the full-batch value whatever the split.

With ℓ the per-token loss, m the loss mask, k the keep mask (IS/OPSM/M2PO removals), T the
global valid-token count, S the global valid-sequence count (rows with at least one loss
token) and C a constant:

    token_mean               Σ_{i,t} k·m·ℓ / T
    seq_mean_token_mean      (1/S) Σ_i [Σ_t k·m·ℓ / Σ_t m]
    seq_mean_token_sum       (1/S) Σ_i Σ_t k·m·ℓ
    seq_mean_token_sum_norm  (1/S) Σ_i Σ_t k·m·ℓ / C     (Dr. GRPO; C = max length)

The keep mask removes a token from the numerator only: denominators always count the
loss mask. baidu-baige/LoongSage's IS ``mask`` action also shrinks the denominator; doing so here
would need the keep count of the whole batch before the first micro-batch, so we keep it fixed (the
same choice baidu-baige/LoongSage makes for OPSM and M2PO makes for its masked tokens).

Metrics follow the same rule: ``token_metric`` / ``seq_metric`` return a micro-batch's
share of the mini-batch mean, so metrics are *summed* over micro-batches (see
``loongsage.algorithms.metrics.sum_metrics``).
"""

from __future__ import annotations

from typing import Callable

import torch

from loongsage.schema import AGG_MODES


def valid_rows(mask: torch.Tensor) -> torch.Tensor:
    """[N] float: 1 for rows holding at least one loss token."""
    return (mask.sum(-1) > 0).to(mask.dtype)


def _token_mean(num: torch.Tensor, mask: torch.Tensor, tokens: float, seqs: float, c: float):
    return num.sum() / max(tokens, 1.0)


def _seq_mean_token_mean(num: torch.Tensor, mask: torch.Tensor, tokens: float, seqs: float, c: float):
    per_seq = num.sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per_seq.sum() / max(seqs, 1.0)


def _seq_mean_token_sum(num: torch.Tensor, mask: torch.Tensor, tokens: float, seqs: float, c: float):
    return num.sum() / max(seqs, 1.0)


def _seq_mean_token_sum_norm(num: torch.Tensor, mask: torch.Tensor, tokens: float, seqs: float, c: float):
    return num.sum() / (max(seqs, 1.0) * c)


_AGGREGATORS: dict[str, Callable[..., torch.Tensor]] = {
    "token_mean": _token_mean,
    "seq_mean_token_mean": _seq_mean_token_mean,
    "seq_mean_token_sum": _seq_mean_token_sum,
    "seq_mean_token_sum_norm": _seq_mean_token_sum_norm,
}


def aggregate(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    global_num_tokens: float,
    global_num_seqs: float,
    keep: torch.Tensor | None = None,
    norm_len: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss [N, L] to this micro-batch's share of the mini-batch loss.

    ``norm_len`` is C of ``seq_mean_token_sum_norm``; None uses the padded width L.
    """
    try:
        reducer = _AGGREGATORS[mode]
    except KeyError:
        raise ValueError(f"loss_agg_mode must be one of {AGG_MODES}, got {mode!r}") from None
    weight = mask if keep is None else mask * keep
    num = torch.where(weight > 0, loss * weight, torch.zeros_like(loss))
    c = float(norm_len) if norm_len else float(loss.shape[-1])
    return reducer(num, mask, float(global_num_tokens), float(global_num_seqs), c)


def token_metric(values: torch.Tensor, mask: torch.Tensor, global_num_tokens: float) -> float:
    """This micro-batch's share of the mini-batch token mean of ``values`` [N, L]."""
    num = torch.where(mask > 0, values.detach() * mask, torch.zeros_like(mask))
    return float(num.sum()) / max(float(global_num_tokens), 1.0)


def seq_metric(values: torch.Tensor, mask: torch.Tensor, global_num_seqs: float) -> float:
    """This micro-batch's share of the mini-batch mean of per-sequence ``values`` [N]."""
    rows = valid_rows(mask)
    num = torch.where(rows > 0, values.detach().to(rows.dtype) * rows, torch.zeros_like(rows))
    return float(num.sum()) / max(float(global_num_seqs), 1.0)
