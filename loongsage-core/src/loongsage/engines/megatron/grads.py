"""Gradient reduction, global norm and clipping for Megatron parameters without Megatron's DDP.

After the schedule's backward every rank holds the gradient of its own rows for its own
parameter shards. ``reduce_gradients`` sums them over the data-parallel group (our losses
are divided by global token counts, so the sum is the full-batch gradient) and, with a tied
embedding split across pipeline stages, over the embedding group (first and last stage
each hold a copy whose gradients must add up, as Megatron's ``finalize_model_grads`` does).
Parameters replicated over tensor-parallel ranks (norms, the router) need nothing: without
sequence parallelism their gradients are already equal on every TP rank.

``clip_and_norm`` takes the global 2-norm counting every parameter once: TP-sharded
parameters (``convert.tp_sharded``; Megatron's own ``tensor_model_parallel`` attribute is
only set when Megatron initialises the weights itself) on every TP rank, replicated ones on TP rank 0 only,
the last stage's tied copy of the embedding not at all; squares are summed over the
model-parallel group (TP x PP). Clipping is ``torch.nn.utils.clip_grads_with_norm_``, the
embedded engine's.
"""

from __future__ import annotations

import torch

from loongsage.engines.megatron.convert import tp_sharded
from loongsage.engines.megatron.parallel import MegatronRanks


def _tied_copy(model: torch.nn.Module, ranks: MegatronRanks) -> torch.nn.Parameter | None:
    """The embedding/output weight shared across stages, on the stages holding it."""
    if ranks.layout.pp == 1 or not model.share_embeddings_and_output_weights:
        return None
    if ranks.first_stage or ranks.last_stage:
        return model.shared_embedding_or_output_weight()
    return None


def reduce_gradients(model: torch.nn.Module, ranks: MegatronRanks) -> None:
    import torch.distributed as dist

    if ranks.layout.dp > 1:
        for param in model.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad, group=ranks.dp_group)
    tied = _tied_copy(model, ranks)
    if tied is not None:
        if tied.grad is None:
            tied.grad = torch.zeros_like(tied)
        dist.all_reduce(tied.grad, group=ranks.embedding_group)


def clip_and_norm(model: torch.nn.Module, ranks: MegatronRanks, max_norm: float) -> float:
    """Clip every gradient by the global norm (when ``max_norm`` > 0); return that norm."""
    import torch.distributed as dist

    tied = _tied_copy(model, ranks)
    skip = tied if tied is not None and not ranks.first_stage else None
    squares = torch.zeros((), dtype=torch.float64)
    named = [(name, p) for name, p in model.named_parameters() if p.grad is not None]
    params = [p for _, p in named]
    for name, param in named:
        if (tp_sharded(name) or ranks.tp_rank == 0) and param is not skip:
            squares += param.grad.double().pow(2).sum().cpu()
    if ranks.layout.tp * ranks.layout.pp > 1:
        dist.all_reduce(squares, group=ranks.model_group)
    norm = float(squares.sqrt())
    if max_norm > 0 and params:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, torch.tensor(norm))
    return norm
