"""Which experts each token was routed to, in a Megatron MoE model (for router replay, R3).

``routed_experts`` runs the engine's forward over a batch with a forward hook on every MoE
layer's router and returns, for each token, the ids of the ``top-k`` experts its router
chose in each layer: ``[N, L, layers, k]`` long, aligned with ``input_ids`` (the routing of
token t sits at position t), ascending ids, ``-1`` at padding. Megatron-Core 0.16.1 also
ships ``RouterReplay`` (``moe_enable_routing_replay``: record / replay top-k indices inside
``topk_routing_with_score_function``); the hook here records without enabling it, so the
engine's routers run exactly as configured. Replaying recorded experts into Megatron's
routers is not wired yet (``docs/backends.md``).
"""

from __future__ import annotations

from typing import Any

import torch

from loongsage.engines.batch import TrainBatch


def _routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    from megatron.core.transformer.moe.router import TopKRouter

    return [m for m in model.modules() if isinstance(m, TopKRouter)]


def routed_experts(engine: Any, batch: TrainBatch) -> torch.Tensor:
    """``[N, L, layers, k]`` expert ids per token and MoE layer (see the module docstring)."""
    import torch.distributed as dist

    routers = _routers(engine.model)
    if not routers:
        raise ValueError(f"{engine.hf_config.model_type}: the model has no MoE layers to record")
    k = engine.hf_config.num_experts_per_tok
    seen: list[list[torch.Tensor]] = [[] for _ in routers]

    def hook(index: int):
        def record(module: Any, args: Any, output: tuple) -> None:
            probs, routing_map = output
            chosen = routing_map.nonzero()[:, 1].view(-1, k)  # row-major: ascending ids per token
            seen[index].append(chosen.detach().cpu())
        return record

    handles = [router.register_forward_hook(hook(i)) for i, router in enumerate(routers)]
    try:
        engine.compute_logprobs(batch)
    finally:
        for handle in handles:
            handle.remove()
    parts = []
    for micro in engine._micro_batches(batch):
        n, length = micro.input_ids.shape
        per_layer = [layer.pop(0).view(length, n, k).transpose(0, 1) for layer in seen]
        parts.append(torch.stack(per_layer, dim=2))  # [n, L, layers, k]
    local = torch.cat(parts)
    if engine.layout.pp > 1:  # each stage holds its own layers: put them in stage order
        stages: list[Any] = [None] * engine.layout.pp
        dist.all_gather_object(stages, local, group=engine.parallel.pp_group)
        local = torch.cat(stages, dim=2)
    return local.masked_fill(~batch.attention_mask.bool()[:, :, None, None], -1)
