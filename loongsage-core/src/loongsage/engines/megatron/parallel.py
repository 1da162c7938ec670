"""Megatron's tensor / pipeline / data-parallel groups on the train ranks' process group.

The train ranks join one torch process group exactly as the embedded engine's do
(``engines.distributed``: rank 0's TCP store, gloo on CPU, NCCL beside gloo on GPUs);
``initialize_model_parallel`` then carves it into TP, PP and DP groups (Megatron's order
``tp-cp-ep-dp-pp``: TP ranks are neighbours). A run with a single rank uses an in-memory
store.

``MegatronRanks`` is the engine's ``parallel`` object, the same interface the controller
already drives for DDP/FSDP2 (``train_step.TrainStep``, ``weight_sync``): ``rank``
and ``world_size`` are the **data-parallel** rank and size, because the controller shards a
step's rows over data-parallel ranks only; every TP/PP rank of one data-parallel replica
receives the same rows. ``gather_rows`` and ``global_counts`` therefore run over the DP
group. Metrics: each DP replica reports its additive shares once (from its TP rank 0 on the
last stage); its other ranks report the same keys with zero shares and the same rank-global
values, so ``combine_rank_metrics`` (and the warm start's sum of losses) counts each share
exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterable, Iterator

import torch

from loongsage.engines.distributed import RANK_GLOBAL_METRICS, RankShards
from loongsage.engines.megatron import cpu_shims
from loongsage.errors import ConfigError


@dataclass(frozen=True)
class Layout:
    """Parallel sizes of the Megatron train ranks (``train.megatron`` and ``train.dp_size``)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp


def init_groups(layout: Layout, rank: int, store: Any, device: torch.device, seed: int) -> None:
    """Join the process group (all ranks at once) and build Megatron's parallel groups."""
    import torch.distributed as dist

    try:
        from megatron.core import parallel_state
    except ImportError as err:
        raise ConfigError("train.backend", f"megatron needs megatron-core ({err}); install "
                          "loongsage-core[megatron]") from None
    cpu_shims.install()
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=store, rank=rank, world_size=layout.world_size,
                                timeout=timedelta(minutes=10))
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(layout.tp, layout.pp)
    cpu_shims.seed_model_parallel(seed)


class MegatronRanks:
    """The engine's view of its groups; see the module docstring."""

    strategy = "megatron"

    def __init__(self, layout: Layout) -> None:
        from megatron.core import parallel_state as ps

        self.layout = layout
        self.rank = ps.get_data_parallel_rank()
        self.world_size = ps.get_data_parallel_world_size()
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.pp_rank = ps.get_pipeline_model_parallel_rank()
        self.first_stage = ps.is_pipeline_first_stage()
        self.last_stage = ps.is_pipeline_last_stage()
        self.dp_group = ps.get_data_parallel_group()
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.pp_group = ps.get_pipeline_model_parallel_group()
        self.model_group = ps.get_model_parallel_group()
        self.embedding_group = ps.get_embedding_group() if layout.pp > 1 else None

    @property
    def reports_shares(self) -> bool:
        """Whether this rank's additive metrics count (one rank per data-parallel replica)."""
        return self.tp_rank == 0 and self.last_stage

    def share_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """The replica's metrics on each of its ranks: the reporting rank's additive shares,
        zeros on the others (so a sum over ranks counts each share once)."""
        import torch.distributed as dist

        if self.layout.tp * self.layout.pp > 1:
            every: list[Any] = [None] * (self.layout.tp * self.layout.pp)
            dist.all_gather_object(every, (self.reports_shares, metrics), group=self.model_group)
            metrics = next(values for reports, values in every if reports)
        if self.reports_shares:
            return metrics
        return {k: (v if k in RANK_GLOBAL_METRICS else 0.0) for k, v in metrics.items()}

    def global_counts(self, tokens: float, seqs: float) -> tuple[float, float]:
        import torch.distributed as dist

        counts = torch.tensor([tokens, seqs], dtype=torch.float64)
        dist.all_reduce(counts, group=self.dp_group)
        return float(counts[0]), float(counts[1])

    def gather_rows(self, local: torch.Tensor, shards: RankShards, total: int) -> torch.Tensor:
        import torch.distributed as dist

        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local, group=self.dp_group)
        return shards.place(parts, total)

    def from_last_stage(self, tensor: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor:
        """The last pipeline stage's ``tensor`` on every stage (fp32, ``shape``)."""
        import torch.distributed as dist

        if self.layout.pp == 1:
            return tensor
        buffer = tensor.contiguous() if self.last_stage else torch.empty(shape, dtype=torch.float32)
        last = dist.get_global_rank(self.pp_group, self.layout.pp - 1)
        dist.broadcast(buffer, src=last, group=self.pp_group)
        return buffer

    def local_rows(self, batch: Any) -> Any:
        size = len(batch) // self.world_size
        return batch.rows(slice(self.rank * size, (self.rank + 1) * size))

    def full_tensors(self, named: Iterable[tuple[str, torch.Tensor]],
                     keep: Callable[[str], bool]) -> Iterator[tuple[str, torch.Tensor]]:
        """``named`` is already gathered (``MegatronTrainEngine.named_tensors``): filter it."""
        return ((name, tensor) for name, tensor in named if keep(name))

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()
