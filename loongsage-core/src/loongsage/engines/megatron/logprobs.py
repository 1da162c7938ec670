"""Per-token log-probs (and entropy) from a Megatron ``GPTModel``, fp32 LM head across TP.

The same alignment and chunking as the embedded engine (``engines.logprobs``,
whose position helpers this reuses): the decoder runs once, then the output layer is
applied in fp32 to the positions that predict a real token, ``chunk_tokens`` at a time,
each chunk but the last recomputed in the backward. What differs is the vocabulary: each
tensor-parallel rank holds ``V / tp`` rows of the output weight, so the log-softmax is
vocab-parallel (Megatron's ``vocab_parallel_cross_entropy`` idea, written out so entropy
comes from the same reductions): the max, the sum of exponentials, the target's logit and
``sum(p * logit)`` are all-reduced over the TP group with
``reduce_from_tensor_model_parallel_region`` (forward: all-reduce; backward: identity, as
every TP rank back-propagates the same replicated loss). The hidden states enter the head
through ``copy_to_tensor_model_parallel_region`` (forward: identity; backward: all-reduce),
as in Megatron's column-parallel output layer: each rank's logits see only its vocabulary
rows, so the gradient reaching the decoder is the sum over TP ranks.

A ``LogitTerm`` (distillation) needs the full-vocabulary logits of a chunk; it is supported
at ``tp=1`` only and refused otherwise.

The decoder call is ``GPTModel.forward`` up to the decoder (``_preprocess`` then
``decoder``), so on a later pipeline stage the decoder reads the activations the schedule
set with ``set_input_tensor``. The attention mask is causal plus key padding, as Megatron's
local attention expects it (``True`` = masked).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from loongsage.engines.batch import LogitTerm
from loongsage.engines.logprobs import (
    TokenScores,
    gather_inputs,
    position_ids_from_mask,
    run_chunked,
    scatter_positions,
)
from loongsage.errors import ConfigError


def attention_mask_for(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[N, 1, L, L]`` bool, True where a query may not attend (future or padding keys)."""
    length = attention_mask.shape[1]
    future = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
    padding = ~attention_mask.bool()[:, None, None, :]
    return future[None, None] | padding


def decoder_hidden(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The decoder's output ``[L, N, H]`` (after the final norm on the last stage)."""
    position_ids = position_ids_from_mask(attention_mask)
    pre = model._preprocess(input_ids=input_ids, position_ids=position_ids)
    decoder_input, rotary_pos_emb, rotary_cos, rotary_sin, offset = pre[:5]
    return model.decoder(hidden_states=decoder_input,
                         attention_mask=attention_mask_for(attention_mask).to(input_ids.device),
                         rotary_pos_emb=rotary_pos_emb, rotary_pos_cos=rotary_cos,
                         rotary_pos_sin=rotary_sin, sequence_len_offset=offset)


def output_weight(model: Any) -> torch.Tensor:
    """This TP rank's ``[V / tp, H]`` rows of the output layer (the embedding when tied)."""
    if model.share_embeddings_and_output_weights:
        return model.shared_embedding_or_output_weight()
    return model.output_layer.weight


def _reduce(tensor: torch.Tensor, tp: int) -> torch.Tensor:
    if tp == 1:
        return tensor
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    return reduce_from_tensor_model_parallel_region(tensor)


def _max(tensor: torch.Tensor, tp: int) -> torch.Tensor:
    if tp > 1:
        import torch.distributed as dist
        from megatron.core import parallel_state

        dist.all_reduce(tensor, op=dist.ReduceOp.MAX,
                        group=parallel_state.get_tensor_model_parallel_group())
    return tensor


def _chunk_scores(hidden: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor,
                  vocab_start: int, tp: int, with_entropy: bool,
                  term_fn: Callable[..., torch.Tensor] | None, *term_inputs: torch.Tensor) -> torch.Tensor:
    """``[c, 1 + with_entropy + width]`` for one chunk, reduced over the TP group."""
    logits = torch.nn.functional.linear(hidden.float(), weight)  # [c, V / tp]
    top = _max(logits.detach().max(dim=-1).values, tp)
    shifted = logits - top.unsqueeze(-1)
    exp = shifted.exp()
    total = _reduce(exp.sum(-1), tp)
    local = targets - vocab_start
    mine = (local >= 0) & (local < logits.shape[-1])
    picked = shifted.gather(-1, local.clamp(0, logits.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
    target = _reduce(picked * mine, tp)
    log_total = total.log()
    columns = [(target - log_total).unsqueeze(-1)]
    if with_entropy:
        expected = _reduce((exp * shifted).sum(-1), tp) / total
        columns.append((log_total - expected).unsqueeze(-1))
    if term_fn is not None:
        columns.append(term_fn(logits, *term_inputs).to(logits.dtype))
    return torch.cat(columns, dim=-1)


def token_scores(model: Any, hidden: torch.Tensor, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor, *, tp: int, tp_rank: int, with_entropy: bool = False,
                 chunk_tokens: int = 512, term: LogitTerm | None = None,
                 extras: Mapping[str, torch.Tensor] | None = None,
                 score_mask: torch.Tensor | None = None) -> TokenScores:
    """Log-probs [N, L] (+ entropy, + ``term``'s values) from the last stage's ``hidden``, at
    the positions of ``score_mask`` [N, L] when given (0 elsewhere, as the embedded engine)."""
    if term is not None and tp > 1:
        raise ConfigError("train.megatron.tp", "a logit term (distillation) needs the full "
                          "vocabulary of each position; use tp=1 with the megatron backend")
    if chunk_tokens < 1:
        raise ConfigError("train.logprob_chunk_tokens", f"must be >= 1, got {chunk_tokens}")
    hidden = hidden.transpose(0, 1)[:, :-1]  # [N, L - 1, H]
    wanted = attention_mask[:, 1:].bool()
    if score_mask is not None:
        wanted = wanted & score_mask[:, 1:].bool()
    real = wanted.reshape(-1).nonzero().squeeze(-1)
    flat = hidden.reshape(-1, hidden.shape[-1]).index_select(0, real)
    if tp > 1:  # each rank's logits use its vocabulary rows: sum the hidden states' gradients
        from megatron.core.tensor_parallel.mappings import copy_to_tensor_model_parallel_region

        flat = copy_to_tensor_model_parallel_region(flat)
    targets = input_ids[:, 1:].reshape(-1).index_select(0, real)
    inputs = gather_inputs(extras or {}, term.inputs, real, input_ids.shape[1]) if term else []
    weight = output_weight(model)
    vocab_start = tp_rank * weight.shape[0]
    fn = term.fn if term is not None else None

    def chunk_args(piece: slice) -> tuple:
        return (flat[piece], targets[piece], weight, vocab_start, tp, with_entropy, fn,
                *(x[piece] for x in inputs))

    scores = run_chunked(_chunk_scores, chunk_args, flat.shape[0], chunk_tokens)
    full = scatter_positions(scores, real, input_ids.shape)
    return TokenScores(logprobs=full[..., 0],
                       entropy=full[..., 1] if with_entropy else None,
                       values=full[..., 1 + with_entropy:] if term is not None else None)
