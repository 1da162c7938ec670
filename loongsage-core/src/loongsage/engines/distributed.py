"""Data-parallel train ranks for the embedded train engine: the process group, DDP / FSDP2,
and the collectives one step needs.

The engine holds a ``parallel`` object and calls it at five points: the forward that gives
logprobs, the token/sequence counts of a mini-batch (all-reduced, so loss denominators are
global), ``backward``, the gradient norm, and the weights it hands out (full tensors, FSDP2
gathers them). ``SingleProcess`` is the default and does nothing extra; ``join_group`` (run
inside every rank's actor) replaces it by ``DDPRanks`` or ``FSDP2Ranks`` (``STRATEGIES``).

How a step splits (docs/architecture.md): every rank receives the whole step's batch and the row
indices of its shards (``RankShards``), computes old/reference logprobs of its own rows and
all-gathers them, so each rank holds the full [N, L] tensors and computes advantages and
``Objective.prepare`` on the whole batch (exact for any estimator, batch whitening and M2PO's
statistics included), then trains its rows. DDP and FSDP2 average gradients over ranks while
our losses are already divided by the global counts, so ``backward`` multiplies the loss by
the world size (as verl does) and the sum over ranks is the single-process gradient.

The model is wrapped as ``LogprobForward`` (the decoder body plus our fp32 LM head, one
module), so DDP's reducer and FSDP2's root hooks see the very forward the engine computes;
FSDP2 shards each decoder layer and the root (embeddings, final norm, LM head). Deviation
from torch's usual DDP loop: gradients are synchronised on every micro-batch's backward
(no ``no_sync`` accumulation), which costs bandwidth, not correctness. The frozen reference
model is not wrapped: each rank keeps a full copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import torch
from torch import nn

from pathlib import Path

from loongsage.engines.batch import TrainBatch
from loongsage.engines.logprobs import TokenScores, token_scores
from loongsage.engines.train_state import load_train_state, save_train_state
from loongsage.errors import ConfigError

# train_step metrics that already hold the whole mini-batch's value on every rank; every
# other metric is a rank's additive share (loongsage.algorithms.metrics) and is summed.
RANK_GLOBAL_METRICS = frozenset({"train/grad_norm", "train/lr", "train/num_tokens",
                                 "train/optimizer_steps"})


@dataclass
class RankShards:
    """The rows of one step's batch each rank trains, laid out mini-batch by mini-batch.

    ``index[r]`` holds rank r's global row numbers; every (mini-batch, rank) shard has the
    same length, so ranks run the same number of forwards and backwards (FSDP2 and DDP need
    that). A shorter shard is filled with copies of a real row whose ``pad[r]`` entry is
    True: those rows train with a zero loss mask and their logprobs are discarded.
    """

    index: list[torch.Tensor]  # per rank: [n_local] long
    pad: list[torch.Tensor]  # per rank: [n_local] bool
    mini_batches: int

    @property
    def world_size(self) -> int:
        return len(self.index)

    def local_batch(self, batch: TrainBatch, rank: int) -> TrainBatch:
        """Rank ``rank``'s rows of ``batch``, padding rows masked out of the loss."""
        local = batch.rows(self.index[rank])
        local.loss_mask = local.loss_mask.masked_fill(self.pad[rank].unsqueeze(-1), 0)
        return local

    def place(self, parts: Sequence[torch.Tensor], total: int) -> torch.Tensor:
        """Scatter every rank's per-row tensor (``parts[r]`` [n_local, ...]) into [total, ...]."""
        out = parts[0].new_zeros((total, *parts[0].shape[1:]))
        for part, index, pad in zip(parts, self.index, self.pad):
            out[index[~pad]] = part[~pad]
        return out


def combine_rank_metrics(per_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One step's metrics from every rank's ``train_step`` result (see ``RANK_GLOBAL_METRICS``)."""
    combined: dict[str, float] = {}
    for metrics in per_rank:
        for key, value in metrics.items():
            if key in RANK_GLOBAL_METRICS:
                combined.setdefault(key, float(value))
            else:
                combined[key] = combined.get(key, 0.0) + float(value)
    return combined


class SingleProcess:
    """One rank, no process group: what the engine does without data parallelism."""

    rank = 0
    world_size = 1
    strategy = "single"
    # True where each decoder layer's call is a collective (FSDP2 gathers its shards), so every
    # rank must call every layer as often as the others
    layer_calls_are_collective = False

    def token_scores(self, model: nn.Module, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor, **options: Any) -> TokenScores:
        return token_scores(model, input_ids, attention_mask, **options)

    def global_counts(self, tokens: float, seqs: float) -> tuple[float, float]:
        return tokens, seqs

    def max_count(self, count: int) -> int:
        """The largest ``count`` over the ranks (micro-batches: every rank runs as many)."""
        return count

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def total_norm(self, grads: list[torch.Tensor]) -> torch.Tensor:
        return torch.nn.utils.get_total_norm(grads)

    def gather_rows(self, local: torch.Tensor, shards: RankShards, total: int) -> torch.Tensor:
        return shards.place([local], total)

    def local_rows(self, batch: TrainBatch) -> TrainBatch:
        """This rank's equal share of a batch every rank built alike (SFT)."""
        return batch

    def full_tensors(self, named: Iterable[tuple[str, torch.Tensor]],
                     keep: Callable[[str], bool]) -> Iterator[tuple[str, torch.Tensor]]:
        """The kept ``(name, tensor)`` pairs as whole tensors."""
        return ((name, tensor) for name, tensor in named if keep(name))

    def barrier(self) -> None:
        """Nothing to wait for."""

    def save(self, engine: Any, folder: Path) -> None:
        """HF folder (safetensors + tokenizer) plus ``train_state.pt`` for an exact resume."""
        engine.model.save_pretrained(folder)
        engine.tokenizer.save_pretrained(folder)
        save_train_state(folder, engine.optimizer, engine.weight_version)

    def load(self, engine: Any, folder: Path) -> int:
        """Weights, optimizer and RNG state written by ``save``; returns the weight version."""
        return load_train_state(folder, engine.model, engine.optimizer)


class LogprobForward(nn.Module):
    """The engine's logprob forward as one module, so DDP and FSDP2 hooks wrap exactly it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                **options: Any) -> tuple:
        scores = token_scores(self.model, input_ids, attention_mask, **options)
        return scores.logprobs, scores.entropy, scores.values  # tensors the wrappers can see


class DataParallelRanks(SingleProcess):
    """A member of the train ranks' process group; subclasses choose the wrapping."""

    strategy = "data_parallel"

    def __init__(self, model: nn.Module, rank: int, world_size: int, device: torch.device,
                 store: Any) -> None:
        import torch.distributed as dist

        self.rank, self.world_size, self.device = rank, world_size, device
        self.store = store  # rank 0 serves the rendezvous; keep it alive with the group
        if device.type == "cuda":
            torch.cuda.set_device(device)
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(minutes=10))
        self.model = model
        self.module = self.wrap(LogprobForward(model))

    def wrap(self, module: LogprobForward) -> nn.Module:
        raise NotImplementedError

    def token_scores(self, model: nn.Module, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor, **options: Any) -> TokenScores:
        if model is not self.model:  # the frozen reference is a plain copy on every rank
            return token_scores(model, input_ids, attention_mask, **options)
        return TokenScores(*self.module(input_ids, attention_mask, **options))

    def global_counts(self, tokens: float, seqs: float) -> tuple[float, float]:
        import torch.distributed as dist

        counts = torch.tensor([tokens, seqs], dtype=torch.float64)
        dist.all_reduce(counts)
        return float(counts[0]), float(counts[1])

    def max_count(self, count: int) -> int:
        import torch.distributed as dist

        value = torch.tensor([count], dtype=torch.long)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return int(value)

    def backward(self, loss: torch.Tensor) -> None:
        (loss * self.world_size).backward()  # the wrappers average gradients over ranks

    def gather_rows(self, local: torch.Tensor, shards: RankShards, total: int) -> torch.Tensor:
        import torch.distributed as dist

        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local)
        return shards.place(parts, total)

    def local_rows(self, batch: TrainBatch) -> TrainBatch:
        size = len(batch) // self.world_size
        return batch.rows(slice(self.rank * size, (self.rank + 1) * size))

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class DDPRanks(DataParallelRanks):
    """Replicated weights and optimizer state; gradients all-reduced on backward.

    Rank 0 writes checkpoints; every rank loads the same folder (so on several nodes the
    run directory must be on storage they share).
    """

    strategy = "ddp"

    def save(self, engine: Any, folder: Path) -> None:
        if self.rank == 0:
            super().save(engine, folder)
        self.barrier()

    def wrap(self, module: LogprobForward) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index or 0] if self.device.type == "cuda" else None
        # buffers (rotary frequencies) never change: no broadcast on every forward
        return DistributedDataParallel(module, device_ids=ids, broadcast_buffers=False)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder blocks FSDP2 shards one by one (``base_model.layers`` of HF causal LMs)."""
    layers = getattr(model.base_model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ConfigError("train.strategy", f"fsdp2 shards the decoder layers at "
                          f"model.base_model.layers, which {type(model).__name__} does not "
                          "have; use train.strategy=ddp")
    return layers


class FSDP2Ranks(DataParallelRanks):
    """``fully_shard`` per decoder layer and the root: sharded params, grads and optimizer."""

    strategy = "fsdp2"
    layer_calls_are_collective = True

    def wrap(self, module: LogprobForward) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(self.device.type, (self.world_size,))
        for layer in decoder_layers(self.model):
            fully_shard(layer, mesh=mesh)
        return fully_shard(module, mesh=mesh)

    def total_norm(self, grads: list[torch.Tensor]) -> torch.Tensor:
        norm = torch.nn.utils.get_total_norm(grads)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def full_tensors(self, named: Iterable[tuple[str, torch.Tensor]],
                     keep: Callable[[str], bool]) -> Iterator[tuple[str, torch.Tensor]]:
        """Every rank gathers every sharded tensor (a collective), keeps only its own."""
        for name, tensor in named:
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            if keep(name):
                yield name, full

    def save(self, engine: Any, folder: Path) -> None:
        from loongsage.engines.sharded_checkpoint import save_sharded

        save_sharded(engine, folder, self.rank, self.world_size)
        self.barrier()

    def load(self, engine: Any, folder: Path) -> int:
        from loongsage.engines.sharded_checkpoint import load_sharded

        return load_sharded(engine, folder, self.world_size)


STRATEGIES: dict[str, type[DataParallelRanks]] = {"ddp": DDPRanks, "fsdp2": FSDP2Ranks}


def open_store(engine: Any, host: str) -> int:
    """On rank 0: serve the rendezvous store on ``host``; return its port (published via Ray)."""
    from torch.distributed import TCPStore

    engine.rendezvous = TCPStore(host, 0, is_master=True, wait_for_workers=False,
                                 timeout=timedelta(minutes=5))
    return engine.rendezvous.port


def join_group(engine: Any, host: str, port: int, rank: int, world_size: int,
               strategy: str) -> str:
    """Make ``engine`` (an ``EmbeddedTrainEngine``) rank ``rank`` of ``world_size``; an engine
    with a ``join_process_group`` method (``engines.megatron``) joins by it instead.

    All ranks call this at once. The optimizer is rebuilt afterwards: FSDP2 replaces the
    parameters by sharded ones. Returns the process group's backend.
    """
    from torch.distributed import TCPStore

    own_groups = getattr(engine, "join_process_group", None)
    if own_groups is not None:  # an engine that lays out its own parallel groups (megatron)
        return own_groups(host, port, rank, world_size, strategy)
    if strategy not in STRATEGIES:
        raise ConfigError("train.strategy", f"expected one of {sorted(STRATEGIES)}, got "
                          f"{strategy!r}")
    store = getattr(engine, "rendezvous", None) if rank == 0 else None
    if store is None:
        store = TCPStore(host, port, is_master=False, timeout=timedelta(minutes=5))
    engine.parallel = STRATEGIES[strategy](engine.model, rank, world_size, engine.device, store)
    engine.reset_optimizer()
    import torch.distributed as dist

    return str(dist.get_backend())
