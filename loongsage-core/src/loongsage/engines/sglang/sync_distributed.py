"""Weight sync for SGLang servers: trainer rank 0 broadcasts over SGLang's distributed update.

``rollout.backend=sglang`` engines are HTTP servers in other processes, so TransferMesh's
receivers (which run inside the engine's process) cannot reach them. Instead train rank 0
hosts a process group with every server's ranks (``/init_weights_update_group``: NCCL on a
GPU, gloo on CPU) and sends each version bucket by bucket (``/update_weights_from_distributed``,
``distributed_sender.SGLangDistributedSender``). Every train rank takes part in the FSDP2
gathers; only rank 0 keeps the tensors and sends. A ``WeightSync`` (``engines.weight_sync``), opened by
``SGLangServerEngine.weight_sync`` for a disaggregated run; a restarted engine makes a new group
with every current server, then gets the current version.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import ray

from loongsage.engines.weight_sync import engine_values
from loongsage.transfer import TransferConfig, WeightSyncError

_SENDER: dict[str, Any] = {}


def actor_init_sender(engine: Any, urls: list[str], timeout_s: float, bucket_bytes: int) -> str:
    from loongsage.engines.sglang.distributed_sender import SGLangDistributedSender

    actor_close_sender(engine)
    device = str(engine.device)
    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    backend = "nccl" if device.startswith("cuda") else "gloo"
    sender = SGLangDistributedSender(urls, master_address=ray.util.get_node_ip_address(), master_port=port,
                                     backend=backend, bucket_bytes=bucket_bytes, device=device,
                                     timeout_s=timeout_s)
    sender.init_group()
    _SENDER["sender"] = sender
    return backend


def actor_push(engine: Any, version: int, rank: int) -> dict[str, Any]:
    start = time.perf_counter()
    named = engine.named_tensors(include_tied=False)
    tensors = list(engine.parallel.full_tensors(named, lambda name: rank == 0))
    buckets = _SENDER["sender"].sync(tensors, version) if rank == 0 else 0
    size = sum(t.numel() * t.element_size() for _, t in tensors)
    return {"seconds": time.perf_counter() - start, "bytes": size, "buckets": buckets}


def actor_close_sender(engine: Any) -> None:
    sender = _SENDER.pop("sender", None)
    if sender is not None:
        sender.close()


class DistributedWeightSync:
    def __init__(self, trainers: Any, rollout_actors: list, config: TransferConfig) -> None:
        self.trainers, self.rollout_actors, self.config = trainers, rollout_actors, config
        self.last: list[dict[str, Any]] = []
        self._connect()

    def _urls(self) -> list[str]:
        return ray.get([actor.run.remote(lambda engine: engine.url) for actor in self.rollout_actors])

    def _connect(self) -> None:
        ray.get(self.trainers.actors[0].run.remote(actor_init_sender, self._urls(), self.config.timeout_s,
                                                   self.config.bucket_bytes))

    def push(self, version: int) -> dict[str, float]:
        """Send the trainers' weights as ``version``; raise if any server did not apply it."""
        refs = [actor.run.remote(actor_push, version, rank) for rank, actor in enumerate(self.trainers.actors)]
        try:
            self.last = ray.get(refs)
        except ray.exceptions.RayTaskError as err:
            raise WeightSyncError(version, None, f"the distributed update failed: {err}") from err
        behind = {i: v for i, v in enumerate(self.versions()) if v != version}
        if behind:
            raise WeightSyncError(version, None, f"engines {behind} (index: version) did not apply it")
        return self.metrics()

    def replace_engine(self, idx: int, actor: Any, version: int) -> int:
        """A restarted server: a new group with every current server, then ``version``."""
        self.rollout_actors[idx] = actor
        self._connect()
        self.push(version)  # raises unless every engine, the restarted one included, applied it
        return version

    def versions(self) -> list[int | str | None]:
        return engine_values(self.rollout_actors, lambda engine: engine.weight_version)

    def metrics(self) -> dict[str, float]:
        return {"perf/weight_sync_gb": self.last[0]["bytes"] / 1e9 if self.last else 0.0,
                "perf/weight_sync_s": max((r["seconds"] for r in self.last), default=0.0),
                "perf/weight_sync_senders": 1.0}

    def close(self) -> None:
        try:
            ray.get(self.trainers.actors[0].run.remote(actor_close_sender), timeout=30)
        except ray.exceptions.RayError:
            pass
