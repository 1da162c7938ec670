"""Per-token log-probabilities (and entropy) of given token ids under a HF causal LM.

Alignment follows ``loongsage.engines.batch``: ``logprobs[:, t] = log p(ids[t] | ids[:t])``
and position 0 is 0. Instead of the model's own forward (which materialises logits in the
model dtype), we run the decoder body and apply the output embedding ourselves, in fp32
when ``fp32_lm_head`` (MiniMax-M1, arXiv 2506.13585: a bf16 LM head is a main source of train /
inference mismatch). This covers HF causal LMs whose logits are ``lm_head(hidden)``
(Llama, Qwen2/3, Mistral, SmolLM); models with logit soft-capping or scaling are not
special-cased. Position ids come from the attention mask, so left or right padding both
give the positions an unpadded sequence would have.

The LM head and log-softmax run only over real tokens (padding positions get 0), and only
over the scored ones when a ``score_mask`` is given (the train engine's loss mask: a prompt
token's log-probability is never read, and the head is ~20 % of SmolLM2's FLOPs), in chunks
of ``chunk_tokens`` positions, so the fp32 ``[tokens, vocab]`` logits of a whole
micro-batch never exist at once: for SmolLM2 (vocab 49,152) 8 rows of 100 tokens are
157 MB of logits, and autograd used to keep them (and their gradient) for the backward.
With grad enabled every chunk but the last is checkpointed: only its hidden states are
kept, and the backward recomputes its logits (one extra LM-head matmul per such chunk, the
price of never holding more than one chunk of logits; Liger's fused linear cross-entropy
makes the same trade for a scalar loss, here the closure's per-token loss is not known in
forward). A micro-batch of at most ``chunk_tokens`` real tokens is one chunk and pays nothing.

A ``LogitTerm`` (``loongsage.engines.batch``) rides in the same loop: whatever else a loss
needs from the full-vocabulary logits (a divergence against another model's
distribution) is computed from each chunk's logits right after the log-probs, so the logits
are built once per chunk and never for a whole micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from loongsage.engines.batch import LogitTerm

DEFAULT_CHUNK_TOKENS = 512


@dataclass
class TokenScores:
    """Per-token results of one forward: log-probs, entropy, and a ``LogitTerm``'s values."""

    logprobs: torch.Tensor  # [N, L]
    entropy: torch.Tensor | None  # [N, L]
    values: torch.Tensor | None  # [N, L, width]


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """0, 1, 2, ... over the real tokens of each row (padding gets 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def body_hidden(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix_len: int = 0
) -> torch.Tensor:
    """The decoder body's last hidden states [N, L, H].

    With ``prefix_len`` > 0 (every row holds the same first ``prefix_len`` tokens, all real),
    that prefix runs once and the rest of every row runs on top of its cache: attention reads
    the same keys and values as row by row, so the values are the same, and the prefix's FLOPs
    are paid once instead of N times. The rows' rest then runs packed (``packed_tail``: no
    padding through the layers) where the model can take it (``packable``) and
    ``packing_pays``, else padded on the cache repeated over the rows."""
    positions = position_ids_from_mask(attention_mask)
    if prefix_len <= 0:
        out = model.base_model(input_ids=input_ids, attention_mask=attention_mask,
                               position_ids=positions, use_cache=False)
        return out.last_hidden_state
    n = input_ids.shape[0]
    head = model.base_model(input_ids=input_ids[:1, :prefix_len], position_ids=positions[:1, :prefix_len],
                            use_cache=True)
    shared = head.last_hidden_state.expand(n, -1, -1)
    tail_real = attention_mask[:, prefix_len:].bool()
    if packable(model, head.cache) and packing_pays(tail_real, prefix_len, shared.shape[-1]):
        tail = packed_tail(model, input_ids[:, prefix_len:], tail_real, positions[:, prefix_len:], head.cache,
                           shared.dtype)
    else:
        head.cache.batch_repeat_interleave(n)
        tail = model.base_model(input_ids=input_ids[:, prefix_len:], attention_mask=attention_mask,
                                position_ids=positions[:, prefix_len:], cache=head.cache,
                                use_cache=True).last_hidden_state
    return torch.cat([shared, tail], dim=1)


def packable(model: nn.Module, cache: Any) -> bool:
    """Whether the model's attention reads a packed sequence's 4D mask as written: SDPA or
    eager attention (flash kernels take a 2D padding mask) and every layer full attention
    over a full cache. A sliding-window or chunked layer builds its window into the mask
    transformers would make, and takes a given 4D mask as it is, so packed it would see past
    its window (and its cache keeps fewer keys than the mask has columns); a linear-attention
    or state-space layer ignores the mask and would carry one row's state into the next."""
    return (model.config._attn_implementation in ("sdpa", "eager")
            and not any(getattr(cache, "is_sliding", ())) and not any(getattr(cache, "is_linear", ())))


def packing_pays(tail_real: torch.Tensor, prefix_len: int, width: int) -> bool:
    """Whether the rows' real tokens after the prefix (``tail_real`` [N, L]) cost fewer FLOPs
    packed into one sequence than padded to the longest.

    Per layer and token the projections and MLP cost about ``24 * width**2`` FLOPs (Llama-like
    shapes: ``4 width**2`` of attention projections and ``8 width**2`` of gated MLP, times two),
    and each query-key pair ``4 * width`` (scores and the weighted sum). Padded, ``N x L``
    queries each read ``prefix + L`` keys; packed, ``T`` real queries each read ``prefix + T``
    (the mask hides other rows' keys, but the kernel still computes them). So packing wins for
    short replies of uneven length (the main job: 270 real of 384 padded reply tokens) and
    loses for many long rows, where its quadratic attention outgrows the padding it saves.
    """
    rows, length = tail_real.shape
    real = int(tail_real.sum())
    return real * (6 * width + prefix_len + real) < rows * length * (6 * width + prefix_len + length)


def packed_tail(model: nn.Module, input_ids: torch.Tensor, real: torch.Tensor, positions: torch.Tensor,
                cache: Any, dtype: torch.dtype) -> torch.Tensor:
    """Hidden states [N, L, H] (``dtype``, zeros at padding) of the rows' ``real`` tokens run as
    one sequence on top of the prefix's ``cache`` (batch 1), each token seeing the prefix and
    its own row. A shared prefix ends before a loss token, so some row always has one."""
    rows, columns = real.nonzero(as_tuple=True)  # row-major: each row's tokens in order
    width = model.config.hidden_size
    packed_positions = positions[rows, columns]
    mask = packed_tail_mask(rows, packed_positions, cache.get_seq_length(), dtype)
    hidden = model.base_model(input_ids=input_ids[rows, columns][None], attention_mask=mask,
                              position_ids=packed_positions[None], cache=cache, use_cache=True).last_hidden_state
    return hidden.new_zeros(*real.shape, width).index_put((rows, columns), hidden[0])


def packed_tail_mask(rows: torch.Tensor, positions: torch.Tensor, prefix_len: int,
                     dtype: torch.dtype) -> torch.Tensor:
    """Additive mask ``[1, 1, T, prefix_len + T]`` for a packed sequence of ``T`` tokens
    (``rows[i]``: the row token ``i`` came from, ``positions[i]``: its position there) read on
    top of a shared ``prefix_len``-token cache: token ``i`` sees the whole prefix and the
    tokens of its own row at positions up to its own (0 where it may look, the dtype's
    minimum elsewhere: the form both eager and SDPA attention take; SDPA's fused kernels read
    it tile by tile, eager attention and SDPA's math fallback hold ``T x (prefix_len + T)``
    scores per head)."""
    sees = (rows[:, None] == rows[None, :]) & (positions[None, :] <= positions[:, None])
    sees = torch.cat([sees.new_ones(len(rows), prefix_len), sees], dim=1)
    additive = torch.zeros(sees.shape, dtype=dtype, device=sees.device)
    return additive.masked_fill_(~sees, torch.finfo(dtype).min)[None, None]


def final_hidden(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
    score_mask: torch.Tensor | None = None, prefix_len: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hidden [T, H], real [T])``: the decoder body's last hidden state at every position
    that predicts a real token (only those whose token is in ``score_mask`` [N, L], when
    given), and those positions' flat index into ``[N, L - 1]``; ``prefix_len`` as in
    ``body_hidden``."""
    hidden = body_hidden(model, input_ids, attention_mask, prefix_len)[:, :-1]
    wanted = attention_mask[:, 1:].bool()  # predicted tokens that are not padding
    if score_mask is not None:
        wanted = wanted & score_mask[:, 1:].bool()
    real = wanted.reshape(-1).nonzero().squeeze(-1)
    return hidden.reshape(-1, hidden.shape[-1]).index_select(0, real), real


def gather_positions(tensor: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """The entries of a per-token ``[N, L, ...]`` tensor at the ``real`` positions.

    Inverse of ``scatter_positions``: position ``p`` of ``real`` predicts token ``p % (L-1) + 1``
    of row ``p // (L-1)``, so the tensor is read from column 1 on.
    """
    shifted = tensor[:, 1:]
    return shifted.reshape(-1, *shifted.shape[2:]).index_select(0, real)


def gather_inputs(
    extras: Mapping[str, torch.Tensor], keys: tuple[str, ...], real: torch.Tensor, length: int
) -> list[torch.Tensor]:
    """``extras[key]`` at the ``real`` positions of rows ``length`` tokens long, for each key."""
    out = []
    for key in keys:
        tensor = extras[key]
        if tensor.dim() == 1:  # per row: repeat it over the row's positions
            out.append(tensor.index_select(0, torch.div(real, length - 1, rounding_mode="floor")))
        else:
            out.append(gather_positions(tensor, real))
    return out


def scatter_positions(values: torch.Tensor, real: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``[N, L, ...]`` with ``values`` [T, ...] at flat positions ``real`` of columns 1.., zeros
    elsewhere (position 0 and padding)."""
    n, length = shape
    trailing = values.shape[1:]
    flat = values.new_zeros(n * (length - 1), *trailing).index_put((real,), values)
    return torch.cat([values.new_zeros(n, 1, *trailing), flat.view(n, length - 1, *trailing)], dim=1)


def _chunk_scores(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    fp32_lm_head: bool,
    with_entropy: bool,
    entropy_grad: bool,
    term_fn: Callable[..., torch.Tensor] | None,
    *term_inputs: torch.Tensor,
) -> torch.Tensor:
    """``[c, 1 + with_entropy + width]``: log p(target), the entropy, the term's values.
    Without ``entropy_grad`` the entropy is a detached reading (a metric): no backward runs through it."""
    if fp32_lm_head:
        logits = nn.functional.linear(hidden.float(), weight, bias)
    else:
        logits = nn.functional.linear(hidden, weight, bias).float()
    lse = torch.logsumexp(logits, dim=-1)
    columns = [(logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse).unsqueeze(-1)]
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            columns.append((lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)).unsqueeze(-1))
    if term_fn is not None:
        columns.append(term_fn(logits, *term_inputs).to(logits.dtype))
    return torch.cat(columns, dim=-1)


def head_scores(
    model: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    *,
    fp32_lm_head: bool = True,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    term: LogitTerm | None = None,
    term_inputs: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """``[T, 1 + with_entropy + term.width]`` for ``targets`` [T] given final ``hidden`` [T, H]:
    log-probs, entropy, then the term's values, from ``term_inputs`` ([T, ...] each).
    ``entropy_grad=False``: the entropy is read without a gradient (a metric of the loss forward).

    Chunked over T (see the module docstring); differentiable when grad is enabled.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    head = model.get_output_embeddings()
    weight, bias = head.weight, head.bias
    if fp32_lm_head:  # cast once per call, not once per chunk
        weight = weight.float()
        bias = None if bias is None else bias.float()
    fn = term.fn if term is not None else None
    inputs = term_inputs or []
    def chunk_args(piece: slice) -> tuple:
        return (hidden[piece], targets[piece], weight, bias, fp32_lm_head, with_entropy, entropy_grad, fn,
                *(x[piece] for x in inputs))

    return run_chunked(_chunk_scores, chunk_args, hidden.shape[0], chunk_tokens)


def run_chunked(fn: Callable[..., torch.Tensor], chunk_args: Callable[[slice], tuple], total: int,
                chunk_tokens: int) -> torch.Tensor:
    """``fn(*chunk_args(piece))`` over ``total`` positions, ``chunk_tokens`` at a time,
    concatenated. With grad enabled every chunk but the last is checkpointed (recomputed in
    the backward); the last chunk's logits may stay for the backward, which is still one
    chunk's worth. No position at all (a data-parallel padding row) still runs one empty
    chunk, so the result stays attached to the graph and every rank's backward reaches every
    parameter."""
    starts = range(0, max(total, 1), chunk_tokens)
    chunks = []
    for start in starts:
        args = chunk_args(slice(start, start + chunk_tokens))
        recompute = torch.is_grad_enabled() and start != starts[-1]
        chunks.append(checkpoint(fn, *args, use_reentrant=False) if recompute else fn(*args))
    return torch.cat(chunks)


def token_scores(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    fp32_lm_head: bool = True,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    term: LogitTerm | None = None,
    extras: Mapping[str, torch.Tensor] | None = None,
    score_mask: torch.Tensor | None = None,
    prefix_len: int = 0,
) -> TokenScores:
    """Log-probs [N, L] (+ entropy, + ``term``'s values [N, L, width]) of ``input_ids``.

    ``term``'s inputs are read from ``extras`` (the micro-batch's ``TrainBatch.extras``).
    Differentiable when grad is enabled. Entropy at t is that of the distribution that
    predicted token t (so it lines up with ``logprobs``); position 0 and padding positions
    are 0 for every output, and so are positions outside ``score_mask`` [N, L] when given
    (the train engine passes the loss mask: the LM head never runs over the prompt).
    ``prefix_len``: a prefix all rows share, computed once (``body_hidden``).
    """
    hidden, real = final_hidden(model, input_ids, attention_mask, score_mask, prefix_len)
    inputs = gather_inputs(extras or {}, term.inputs, real, input_ids.shape[1]) if term is not None else None
    scores = head_scores(
        model,
        hidden,
        input_ids[:, 1:].reshape(-1).index_select(0, real),
        fp32_lm_head=fp32_lm_head,
        with_entropy=with_entropy,
        entropy_grad=entropy_grad,
        chunk_tokens=chunk_tokens,
        term=term,
        term_inputs=inputs,
    )
    full = scatter_positions(scores, real, input_ids.shape)
    return TokenScores(
        logprobs=full[..., 0],
        entropy=full[..., 1] if with_entropy else None,
        values=full[..., 1 + with_entropy:] if term is not None else None,
    )


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    fp32_lm_head: bool = True,
    with_entropy: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logprobs [N, L], entropy [N, L] or None)`` for the tokens of ``input_ids``."""
    scores = token_scores(model, input_ids, attention_mask, fp32_lm_head=fp32_lm_head,
                          with_entropy=with_entropy, chunk_tokens=chunk_tokens)
    return scores.logprobs, scores.entropy
