"""Per-token log-probabilities (and entropy) of given token ids under a HF causal LM.

Alignment follows ``loongsage.engines.batch``: ``logprobs[:, t] = log p(ids[t] | ids[:t])``
and position 0 is 0. Instead of the model's own forward (which materialises logits in the
model dtype), we run the decoder body and apply the output embedding ourselves, in fp32
when ``fp32_lm_head`` (REFERENCE.md §1.9: a bf16 LM head is a main source of train /
inference mismatch). This covers HF causal LMs whose logits are ``lm_head(hidden)``
(Llama, Qwen2/3, Mistral, SmolLM); models with logit soft-capping or scaling are not
special-cased. Position ids come from the attention mask, so left or right padding both
give the positions an unpadded sequence would have.

The LM head and log-softmax run only over real tokens (padding positions get 0), in chunks
of ``chunk_tokens`` positions, so the fp32 ``[tokens, vocab]`` logits of a whole
micro-batch never exist at once: for SmolLM2 (vocab 49,152) 8 rows of 100 tokens are
157 MB of logits, and autograd used to keep them (and their gradient) for the backward.
With grad enabled every chunk but the last is checkpointed: only its hidden states are
kept, and the backward recomputes its logits (one extra LM-head matmul per such chunk, the
price of never holding more than one chunk of logits; Liger's fused linear cross-entropy
makes the same trade for a scalar loss, here the closure's per-token loss is not known in
forward). A micro-batch of at most ``chunk_tokens`` real tokens is one chunk and pays nothing.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

DEFAULT_CHUNK_TOKENS = 512


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """0, 1, 2, ... over the real tokens of each row (padding gets 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _chunk_scores(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    fp32_lm_head: bool,
    with_entropy: bool,
) -> torch.Tensor:
    """``[c, 1 or 2]``: log p(target) (and the entropy) of one chunk of positions."""
    if fp32_lm_head:
        logits = nn.functional.linear(hidden.float(), weight, bias)
    else:
        logits = nn.functional.linear(hidden, weight, bias).float()
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return picked.unsqueeze(-1)
    entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return torch.stack([picked, entropy], dim=-1)


def head_logprobs(
    model: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    *,
    fp32_lm_head: bool = True,
    with_entropy: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logprobs [T], entropy [T] or None)`` of ``targets`` [T] given final ``hidden`` [T, H].

    Chunked over T (see the module docstring); differentiable when grad is enabled.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    head = model.get_output_embeddings()
    weight, bias = head.weight, head.bias
    if fp32_lm_head:  # cast once per call, not once per chunk
        weight = weight.float()
        bias = None if bias is None else bias.float()
    starts = range(0, hidden.shape[0], chunk_tokens)
    chunks = []
    for start in starts:
        args = (hidden[start : start + chunk_tokens], targets[start : start + chunk_tokens],
                weight, bias, fp32_lm_head, with_entropy)
        # the last chunk's logits may stay for the backward: that is still one chunk
        recompute = torch.is_grad_enabled() and start != starts[-1]
        chunks.append(checkpoint(_chunk_scores, *args, use_reentrant=False) if recompute else _chunk_scores(*args))
    scores = torch.cat(chunks) if chunks else hidden.new_zeros(0, 1 + with_entropy, dtype=torch.float32)
    return scores[:, 0], (scores[:, 1] if with_entropy else None)


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    fp32_lm_head: bool = True,
    with_entropy: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logprobs [N, L], entropy [N, L] or None)`` for the tokens of ``input_ids``.

    Differentiable when grad is enabled. Entropy at t is that of the distribution that
    predicted token t (so it lines up with ``logprobs``); position 0 and padding positions
    are 0 for both.
    """
    out = model.base_model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    )
    hidden = out.last_hidden_state[:, :-1]
    real = attention_mask[:, 1:].reshape(-1).nonzero().squeeze(-1)  # predicted tokens that are not padding
    logprobs, entropy = head_logprobs(
        model,
        hidden.reshape(-1, hidden.shape[-1]).index_select(0, real),
        input_ids[:, 1:].reshape(-1).index_select(0, real),
        fp32_lm_head=fp32_lm_head,
        with_entropy=with_entropy,
        chunk_tokens=chunk_tokens,
    )
    return _scatter_rows(logprobs, real, input_ids.shape), (
        None if entropy is None else _scatter_rows(entropy, real, input_ids.shape)
    )


def _scatter_rows(values: torch.Tensor, index: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``[N, L]`` with ``values`` at flat positions ``index`` of columns 1.., zeros elsewhere."""
    n, length = shape
    flat = values.new_zeros(n * (length - 1)).index_put((index,), values)
    return torch.cat([values.new_zeros(n, 1), flat.view(n, length - 1)], dim=1)
