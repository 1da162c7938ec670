"""The train ranks of a run: ``train.dp_size`` engine actors, one process group when > 1.

Rank 0 serves the rendezvous store on its node and the controller hands its address to the
other ranks through Ray (``engines.distributed.open_store`` / ``join_group``). A step's batch
goes into Ray's object store once; every rank receives the reference and its row indices
(``RankShards``), fetches the batch where it runs and trains its rows, so tensors never pass
through the driver per rank. Each rank's metrics are its share; ``combine_rank_metrics``
sums the shares and keeps the values that are already global.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import ray
import torch

from loongsage.controller.train_step import TrainStep
from loongsage.engines.batch import TrainBatch
from loongsage.engines.distributed import RankShards, combine_rank_metrics, join_group, open_store


class TrainGroup:
    """Every train rank's actor, addressed together."""

    def __init__(self, actors: Sequence[Any]) -> None:
        self.actors = list(actors)
        self.backend: str | None = None  # the process group's, once connected

    def connect(self, rank0_host: str, strategy: str) -> None:
        """Join the ranks into one process group (``train.strategy``); nothing for one rank."""
        if len(self.actors) < 2:
            return
        port = ray.get(self.actors[0].run.remote(open_store, rank0_host))
        world = len(self.actors)
        self.backend = ray.get([
            actor.run.remote(join_group, rank0_host, port, rank, world, strategy)
            for rank, actor in enumerate(self.actors)])[0]

    @property
    def world_size(self) -> int:
        return len(self.actors)

    def call(self, method: str, *args: Any) -> list:
        """``engine.method(*args)`` on every rank at once; their results in rank order."""
        return ray.get([actor.call.remote(method, *args) for actor in self.actors])

    def start(self, fn: Callable[..., Any], *args: Any) -> list:
        """``fn(engine, *args)`` started on every rank at once; their result refs in rank order."""
        return [actor.run.remote(fn, *args) for actor in self.actors]

    def run(self, fn: Callable[..., Any], *args: Any) -> list:
        """``fn(engine, *args)`` on every rank at once; their results in rank order."""
        return ray.get(self.start(fn, *args))

    def inspect(self, fn: Callable[..., Any], *args: Any) -> list:
        """``EngineHost.inspect`` on every rank: a cheap read beside a running call."""
        return ray.get([actor.inspect.remote(fn, *args) for actor in self.actors])

    def train(self, batch: TrainBatch, rewards: torch.Tensor, group_index: torch.Tensor,
              shards: RankShards, step: TrainStep,
              keep_rows: Sequence[int] = ()) -> tuple[dict[str, float], dict[str, torch.Tensor] | None]:
        """One step on every rank: the batch is put once, each rank runs ``step`` on its shards.
        Returns the combined metrics and, from rank 0, the pi_old logprobs and advantages of the
        rows ``keep_rows`` (``TrainStep``; None without an RL loss)."""
        data = ray.put((batch, rewards, group_index))
        per_rank = self.run(step, data, shards, list(keep_rows))
        metrics = step.finish_metrics(combine_rank_metrics([metrics for metrics, _ in per_rank]))
        return metrics, per_rank[0][1]

    def kill(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
