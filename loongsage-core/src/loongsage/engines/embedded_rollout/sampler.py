"""Batched token sampling with per-row settings, and the logprob the engine reports.

Sampling applies temperature, top-k, top-p and min-p per row (rows with temperature 0 are
greedy). The reported logprob is deliberately *not* the logprob under that filtered,
tempered distribution: it is ``log_softmax(logits)[token]`` of the raw model distribution,
computed in fp32 from the very logits that were sampled from. That is the quantity a train
engine computes for the same tokens (``log_softmax`` of its fp32 logits), so the rollout
and train logprobs agree to float rounding and any importance-sampling correction sees only
the real train/inference mismatch. With the RL default (temperature 1, top-p 1, top-k off)
the raw and the sampling distribution coincide; with other settings a consumer that wants
the behaviour policy's logprob must recompute it. SGLang's choice here has varied between
versions (it has an option to return the original, unscaled logprob): do not rely on either
engine reporting the tempered value.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowSettings:
    """Per-row sampling tensors for one forward's batch (built once per batch change)."""

    temperature: torch.Tensor  # [B] float, 0 rows are greedy
    top_p: torch.Tensor  # [B] float
    top_k: torch.Tensor  # [B] long, <= 0 means off
    min_p: torch.Tensor  # [B] float
    all_greedy: bool
    any_top_p: bool
    any_top_k: bool
    any_min_p: bool
    any_greedy: bool  # some row has temperature 0 (its token is the argmax)

    @classmethod
    def build(cls, temperature: list[float], top_p: list[float], top_k: list[int],
              min_p: list[float], device: torch.device | str = "cpu") -> "RowSettings":
        return cls(
            torch.tensor(temperature, dtype=torch.float32, device=device),
            torch.tensor(top_p, dtype=torch.float32, device=device),
            torch.tensor(top_k, dtype=torch.long, device=device),
            torch.tensor(min_p, dtype=torch.float32, device=device),
            all(t == 0 for t in temperature),
            any(p < 1 for p in top_p),
            any(k > 0 for k in top_k),
            any(m > 0 for m in min_p),
            any(t == 0 for t in temperature),
        )


def _filter(scaled: torch.Tensor, s: RowSettings) -> torch.Tensor:
    """Mask (to -inf) the tokens each row's top-k / top-p / min-p excludes."""
    neg_inf = torch.finfo(scaled.dtype).min
    if s.any_top_k:
        k = torch.where(s.top_k > 0, s.top_k, scaled.shape[-1]).clamp(max=scaled.shape[-1])
        kmax = int(k.max())
        top_vals = scaled.topk(kmax, dim=-1).values
        kth = top_vals.gather(-1, (k - 1).unsqueeze(-1))
        scaled = scaled.masked_fill(scaled < kth, neg_inf)
    if s.any_top_p:
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # drop a token when the mass strictly before it already reaches top_p
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= s.top_p.unsqueeze(-1)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, neg_inf)
    if s.any_min_p:
        probs = scaled.softmax(dim=-1)
        floor = probs.max(dim=-1, keepdim=True).values * s.min_p.unsqueeze(-1)
        scaled = scaled.masked_fill(probs < floor, neg_inf)
    return scaled


def draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs`` [B, V] (rows need not sum to 1), by inverse CDF: the
    row's uniform in [0, 1) (``uniforms`` [B], float64; the scheduler gives each row its own,
    from its request's seed and position, ``engines.sampling_seed``) against the row's
    cumulative sum, taken in float64 so a 49k-entry sum keeps its precision. Draws the same distribution as ``torch.multinomial(probs, 1)``, which costs
    about 1 ms a row on CPU for a 49k vocabulary (it was a sixth of a SmolLM2 decode step at
    batch 32); this costs tens of microseconds a row. A token of probability 0 is never drawn:
    ``right=True`` picks the first index whose cumulative sum exceeds the uniform, and a uniform
    that rounds up to the total is held to the last token of positive probability."""
    cdf = probs.cumsum(dim=-1, dtype=torch.float64)
    total = cdf[:, -1:].contiguous()
    u = uniforms.to(device=probs.device, dtype=torch.float64).view(-1, 1) * total
    last_positive = torch.searchsorted(cdf, total)
    return torch.minimum(torch.searchsorted(cdf, u, right=True), last_positive).squeeze(-1)


def sample(logits: torch.Tensor, s: RowSettings,
           uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row from fp32 ``logits`` [B, V], row ``i`` with ``uniforms[i]``.

    Returns ``(tokens [B] long, logprobs [B] float32)`` where ``logprobs`` is the raw
    model distribution's log-probability of each sampled token (see the module docstring).
    """
    logits = logits.float()
    if s.all_greedy:
        tokens = logits.argmax(dim=-1)
    else:
        temp = torch.where(s.temperature > 0, s.temperature, 1.0).unsqueeze(-1)
        tokens = draw(_filter(logits / temp, s).softmax(dim=-1), uniforms)
        if s.any_greedy:
            tokens = torch.where(s.temperature > 0, tokens, logits.argmax(dim=-1))
    logprobs = logits.log_softmax(dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens, logprobs
