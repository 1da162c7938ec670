"""Phase boundaries of a step: who holds the devices while engines generate, train, sync.

Colocated (``placement.mode=colocated``): a train rank and an engine share each bundle's
device and take turns. Before training, generation stops (partial rollout: in-flight
requests are aborted and resumed later) and the engines release their weights and KV cache;
the train ranks bring their state back from host memory; the engines also hand what their
generation freed back to the OS (on a CPU device, where nothing moves, this is what keeps
the engines' KV cache and activations out of the train phase's peak). Before the weight update the engines
take their weights back; after it the train ranks move parameters, gradients and optimizer
state to host memory while the engines generate. The step terms' actors
(``controller.step_extension``: a value model) share train rank 0's device and move with the
train ranks (their ``onload`` and ``offload`` hooks). On CPU devices the moves are no-ops, the
calls still happen at the same boundaries.

Disaggregated: every actor keeps its own device; generation overlaps training and only
stops for the weight update.
"""

from __future__ import annotations

from typing import Any, Sequence

import ray

from loongsage.controller.step_extension import StepExtensions


def call_engines(engines: Sequence[Any], method: str) -> None:
    """``method`` on every engine; one whose actor died is skipped: the engine monitor
    (``engine_health``) restarts it, and without the monitor the weight sync names it."""
    _wait_all([engine.call.remote(method) for engine in engines])


def release_engine_memory(engines: Sequence[Any]) -> None:
    """Every engine hands its freed heap memory back to the OS (``EngineHost.release_memory``)."""
    _wait_all([engine.release_memory.remote() for engine in engines])


def _wait_all(refs: Sequence[Any]) -> None:
    for ref in refs:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError:
            continue


class ColocatedPhases:
    def __init__(self, scheduler: Any, trainers: Any, engines: Sequence[Any],
                 extensions: StepExtensions | None = None) -> None:
        self.scheduler, self.trainers = scheduler, trainers
        self.extensions = extensions if extensions is not None else StepExtensions()
        self.engines = engines  # the run's own list: a restarted engine takes its slot there

    def to_train(self) -> None:
        self.scheduler.pause()
        call_engines(self.engines, "offload")
        release_engine_memory(self.engines)
        self.trainers.call("onload")
        self.extensions.onload()

    def to_sync(self) -> None:
        call_engines(self.engines, "onload")

    def to_rollout(self) -> None:
        self.trainers.call("offload")
        self.extensions.offload()


class OverlappedPhases:
    def __init__(self, scheduler: Any, trainers: Any, engines: Sequence[Any],
                 extensions: StepExtensions | None = None) -> None:
        self.scheduler = scheduler

    def to_train(self) -> None:
        """Generation goes on while the trainer trains."""

    def to_sync(self) -> None:
        self.scheduler.pause()

    def to_rollout(self) -> None:
        """Every actor kept its device."""


PHASES: dict[str, type] = {"colocated": ColocatedPhases, "disaggregated": OverlappedPhases}
