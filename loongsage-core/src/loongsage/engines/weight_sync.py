"""The weight transport's protocol: what the controller calls to publish a version of the weights.

A run's rollout engine class opens its run's ``WeightSync`` (``RolloutEngine.weight_sync``,
``engines.protocols``): the class knows how weights reach it, so the controller never chooses a
transport. Built-in transports: TransferMesh from every train rank into every engine's process
(``engines.mesh_sync``, the embedded engine's) and SGLang's HTTP weight updates
(``engines.sglang``: from the bundle-mate train rank when colocated, over a process group from
train rank 0 otherwise).

A sync reaches the train ranks through ``TrainRanks`` (the controller's ``TrainGroup``) and
each engine through its actor handle (``EngineHost.run(fn, *args)`` runs ``fn(engine, *args)``
in the engine's process), so it needs nothing of the controller.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, runtime_checkable


@runtime_checkable
class TrainRanks(Protocol):
    """The train ranks as a weight sync sees them: their actors, and a call on all of them."""

    actors: list[Any]

    @property
    def world_size(self) -> int: ...

    def run(self, fn: Callable[..., Any], *args: Any) -> list:
        """``fn(engine, *args)`` in every rank's actor at once; the results in rank order."""


@runtime_checkable
class WeightSync(Protocol):
    """One run's weight transport from the train ranks to the rollout engines.

    Opened once, after the engines started (connections, process groups); ``push`` per update.
    A failed update raises ``transfer.WeightSyncError`` naming the engines that do not hold
    the version; an engine that did not apply it keeps serving its previous one.
    """

    def push(self, version: int) -> dict[str, float]:
        """Send the trainers' weights as ``version`` to every engine; the ``perf/`` metrics."""

    def replace_engine(self, idx: int, actor: Any, version: int) -> int:
        """Connect the restarted engine ``actor`` in slot ``idx`` and send it ``version``; the
        version it holds then (raises when it is not ``version``)."""

    def versions(self) -> list[int | str | None]:
        """The weight version every engine holds (None: its actor died)."""

    def metrics(self) -> dict[str, float]:
        """The last push's ``perf/weight_sync_*`` figures."""

    def close(self) -> None:
        """Close every endpoint still reachable (an actor may have died)."""


def engine_values(actors: Sequence[Any], fn: Callable[[Any], Any]) -> list[Any]:
    """``fn(engine)`` run in each engine actor; None for an actor that died (the engine
    monitor restarts it; a weight sync then reports it as not holding the version)."""
    import ray  # here, not at the top: engine modules import this protocol and stay Ray-free

    values = []
    for ref in [actor.run.remote(fn) for actor in actors]:
        try:
            values.append(ray.get(ref))
        except ray.exceptions.RayActorError:
            values.append(None)
    return values
