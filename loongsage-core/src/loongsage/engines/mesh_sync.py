"""The embedded rollout engine's weight sync: TransferMesh from every train rank to every engine.

A ``WeightSync`` (``engines.weight_sync``), opened by ``EmbeddedRolloutEngine.weight_sync``.

Every train rank runs a sender and sends a disjoint part of the full, HF-named tensors
(``owners_by_size``: largest first, each to the rank with the fewest bytes so far); with
FSDP2 each rank gathers every sharded tensor (all ranks take part in each gather) and keeps
the ones it owns. Each receiver is given every sender's address and applies a version only
once every sender's part arrived and verified (``WeightReceiver``). Tensors go straight from
the trainers' processes to the engines' (shared memory on one host, gloo across hosts; CUDA
IPC / NCCL on GPUs), never through the driver or Ray's object store. The functions prefixed
``actor_`` run inside an actor (shipped with ``EngineHost.run``); each actor process keeps
its mesh endpoint in ``_ENDPOINT``.

A CPU sender's ring of shared-memory slots is sized to hold its whole part of a version, so a
receiver on the same host applies straight from views of the ring (one copy per sync,
1.1-1.3x memcpy measured) instead of staging every bucket (two copies, 2.3x); the cost is a
shared segment the size of the rank's part on the trainer's host. A GPU sender keeps the
configured number of device slots (``transfer.num_slots``), not a copy of its part. Transports are chosen by
host and device; on a GPU the host id carries the physical GPU id, because every actor sees
its own GPU as ``cuda:0`` and only a receiver on the sender's very GPU may take CUDA IPC.

``bind_views`` (colocated runs, where engines are paused while the trainer trains and syncs):
a CPU engine that has ``bind_weights`` keeps the ring's views as its parameters instead of
copying them (``WeightReceiver(bind=...)``), and a CPU train rank keeps its own parameters in
its ring (``TransferMesh.place_in_ring``, ``keep_weights_in``): the optimizer steps the
weights where the engines read them, a sync copies nothing, and the host holds one copy of
the weights instead of three (trainer, ring, engine).
"""

from __future__ import annotations

import dataclasses
import socket
from typing import Any, Sequence

import ray

from loongsage.engines.weight_sync import engine_values
from loongsage.transfer import MeshAddress, TransferConfig, WeightSyncError

_ENDPOINT: dict[str, Any] = {}


def ring_slots(part_bytes: Sequence[int], config: TransferConfig) -> int:
    """Slots that hold one whole version of a part: the packer fills every bucket and pads each
    tensor to ``ALIGN``, so the part takes ceil(padded bytes / bucket) buckets, and not one more
    (every slot is a touched, shared ``bucket_bytes`` of memory in the sender and each engine)."""
    from loongsage.transfer.bucketing import ALIGN

    padded = sum(-(-size // ALIGN) * ALIGN for size in part_bytes)
    return max(config.num_slots, -(-padded // config.bucket_bytes))


def owners_by_size(sizes: Sequence[tuple[str, int]], world_size: int) -> dict[str, int]:
    """The sending rank of every tensor: largest first, to the least-loaded rank (ties: lowest)."""
    load = [0] * world_size
    owners = {}
    for name, size in sorted(sizes, key=lambda item: (-item[1], item[0])):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        owners[name] = rank
        load[rank] += size
    return owners


def mesh_place(device: Any) -> tuple[str, str]:
    """(host id, device) this actor reports to TransferMesh (see the module docstring)."""
    device = str(device)
    host = socket.gethostname()
    if device.startswith("cuda"):
        host = f"{host}/gpu{ray.get_gpu_ids()[0]}"
    return host, device


def actor_start_sender(engine: Any, config: TransferConfig, rank: int, world_size: int,
                       in_ring: bool = False) -> MeshAddress:
    from loongsage.engines.memory import release_free_memory
    from loongsage.transfer import TransferMesh

    named = engine.named_tensors(include_tied=False)
    sizes = [(name, t.numel() * t.element_size()) for name, t in named]
    owners = owners_by_size(sizes, world_size)
    _ENDPOINT["owned"] = {name for name, owner in owners.items() if owner == rank}
    host, device = mesh_place(engine.device)
    slots = config.num_slots
    if device == "cpu":  # a shared-memory ring that holds this rank's whole part: zero-copy receivers
        slots = ring_slots([size for name, size in sizes if owners[name] == rank], config)
    mesh = TransferMesh(dataclasses.replace(config, num_slots=slots), sender_rank=rank,
                        host_id=host, device=device)
    _ENDPOINT["mesh"] = mesh.start()
    if in_ring and device == "cpu" and not config.delta and hasattr(engine, "keep_weights_in"):
        engine.keep_weights_in(mesh.place_in_ring, _ENDPOINT["owned"])
        release_free_memory()  # the parameters' own storage, freed
    return mesh.address


def actor_start_receiver(engine: Any, senders: list[MeshAddress], timeout_s: float,
                         bind_views: bool = False) -> None:
    from loongsage.transfer import WeightReceiver

    host, device = mesh_place(engine.device)
    bind = bind_views and device == "cpu" and hasattr(engine, "bind_weights")
    _ENDPOINT["receiver"] = WeightReceiver(
        senders, engine.apply_weights, host_id=host, device=device, timeout_s=timeout_s,
        zero_copy=True, bind=engine.bind_weights if bind else None,
        lost=engine.weights_lost if bind else None).start()


def actor_wait_for_receivers(engine: Any, count: int, timeout_s: float) -> list[str]:
    return _ENDPOINT["mesh"].wait_for_receivers(count, timeout_s)


def actor_push(engine: Any, version: int) -> dict[str, Any]:
    owned = _ENDPOINT["owned"]
    # gathered up front: every rank takes part in every FSDP2 gather before any sends
    tensors = list(engine.parallel.full_tensors(engine.named_tensors(include_tied=False),
                                                owned.__contains__))
    report = _ENDPOINT["mesh"].sync(tensors, version)
    return {"seconds": report.seconds, "bytes": report.payload_bytes,
            "failed": dict(report.failed), "transports": dict(report.transports)}


def actor_applied_version(engine: Any) -> int | None:
    return _ENDPOINT["receiver"].applied_version


def actor_close(engine: Any) -> None:
    for endpoint in [_ENDPOINT.get("receiver"), _ENDPOINT.get("mesh")]:
        if endpoint is not None:
            endpoint.close()
    _ENDPOINT.clear()


class MeshWeightSync:
    """Connects every train rank to every rollout actor once; ``push(version)`` per update."""

    def __init__(self, trainers: Any, rollout_actors: list, config: TransferConfig,
                 bind_views: bool = False) -> None:
        self.trainers = trainers
        self.rollout_actors = rollout_actors
        self.config = config
        self.bind_views = bind_views
        world = trainers.world_size
        self.addresses = ray.get([actor.run.remote(actor_start_sender, config, rank, world,
                                                   bind_views)
                                  for rank, actor in enumerate(trainers.actors)])
        ray.get([actor.run.remote(actor_start_receiver, self.addresses, config.timeout_s,
                                  bind_views) for actor in rollout_actors])
        trainers.run(actor_wait_for_receivers, len(rollout_actors), config.timeout_s)
        self.last: list[dict[str, Any]] = []

    def replace_engine(self, idx: int, actor: Any, version: int) -> int:
        """Connect the restarted engine ``actor`` in slot ``idx`` and send it ``version``.

        The meshes take late joiners (a full version for them); the others apply the same
        version again. Only the new engine's result decides: the dead one's receiver may
        still be listed until the mesh notices its socket closed. Returns the version the
        engine reports; raises ``WeightSyncError`` when it did not apply ``version``.
        """
        self.rollout_actors[idx] = actor
        ray.get(actor.run.remote(actor_start_receiver, self.addresses, self.config.timeout_s,
                                 self.bind_views))
        self.trainers.run(actor_wait_for_receivers, len(self.rollout_actors), self.config.timeout_s)
        self.last = self.trainers.run(actor_push, version)
        applied = ray.get(actor.run.remote(actor_applied_version))
        if applied != version:
            errors = {rank: report["failed"] for rank, report in enumerate(self.last) if report["failed"]}
            raise WeightSyncError(version, None, f"the restarted engine {idx} holds version {applied}: {errors}")
        return applied

    def push(self, version: int) -> dict[str, float]:
        """Send the trainers' weights as ``version``; raise if any engine did not apply it."""
        self.last = self.trainers.run(actor_push, version)
        failed = {}
        for rank, report in enumerate(self.last):
            failed.update({f"{receiver} (from rank {rank})": error
                           for receiver, error in report["failed"].items()})
        if failed:
            raise WeightSyncError(version, None, f"not applied by {sorted(failed)}: {failed}; "
                                  "those engines still serve their previous version (or, where "
                                  "their weights are views of the ring, refuse requests until "
                                  "one is applied)")
        return self.metrics()

    def versions(self) -> list[int | None]:
        """The weight version every engine applied last (None: its actor died), as the
        ``WeightSync`` protocol says; the engine monitor's ``heal`` reads it after restarts."""
        return engine_values(self.rollout_actors, actor_applied_version)

    def metrics(self) -> dict[str, float]:
        """The last push's ``perf/`` figures."""
        return {"perf/weight_sync_gb": sum(r["bytes"] for r in self.last) / 1e9,
                "perf/weight_sync_s": max(r["seconds"] for r in self.last),
                "perf/weight_sync_senders": float(len(self.last))}

    def close(self) -> None:
        """Close every endpoint that is still reachable (an actor may have died)."""
        for actor in [*self.trainers.actors, *self.rollout_actors]:
            try:
                ray.get(actor.run.remote(actor_close), timeout=30)
            except ray.exceptions.RayError:
                continue
