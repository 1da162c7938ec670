"""Phase boundaries of a step: who holds the devices while engines generate, train, sync.

Colocated (``placement.mode=colocated``): a train rank and an engine share each bundle's
device and take turns. Before training, generation stops (partial rollout: in-flight
requests are aborted and resumed later) and the engines release their weights and KV cache;
the train ranks bring their state back from host memory. Before the weight update the engines
take their weights back; after it the train ranks move parameters, gradients and optimizer
state to host memory while the engines generate. A critic (``controller.critic``) shares train
rank 0's device and moves with the train ranks. On CPU devices the moves are no-ops, the
calls still happen at the same boundaries.

Disaggregated: every actor keeps its own device; generation overlaps training and only
stops for the weight update.
"""

from __future__ import annotations

from typing import Any, Sequence

import ray


class ColocatedPhases:
    def __init__(self, scheduler: Any, trainers: Any, engines: Sequence[Any], critic: Any = None) -> None:
        self.scheduler, self.trainers, self.engines = scheduler, trainers, list(engines)
        self.holders = [trainers] if critic is None else [trainers, critic]

    def to_train(self) -> None:
        self.scheduler.pause()
        ray.get([engine.call.remote("offload") for engine in self.engines])
        for holder in self.holders:
            holder.call("onload")

    def to_sync(self) -> None:
        ray.get([engine.call.remote("onload") for engine in self.engines])

    def to_rollout(self) -> None:
        for holder in self.holders:
            holder.call("offload")


class OverlappedPhases:
    def __init__(self, scheduler: Any, trainers: Any, engines: Sequence[Any], critic: Any = None) -> None:
        self.scheduler = scheduler

    def to_train(self) -> None:
        """Generation goes on while the trainer trains."""

    def to_sync(self) -> None:
        self.scheduler.pause()

    def to_rollout(self) -> None:
        """Every actor kept its device."""


PHASES: dict[str, type] = {"colocated": ColocatedPhases, "disaggregated": OverlappedPhases}
