"""Weight sync for colocated SGLang servers: each train rank hands its bundle-mate handles.

In a colocated run bundle i holds train rank i and rollout engine i on one device (one GPU,
or the host's memory), so train rank i sends engine i every version through SGLang's
``/update_weights_from_tensor`` (``tensor_sender.SGLangTensorSender``): per bucket,
one HTTP request carrying CUDA IPC handles on a GPU, shared-memory handles on CPU; the
server maps the trainer's memory and copies from it. No process group, no bytes through a
socket. Every train rank takes part in the FSDP2 gathers; a rank with an engine keeps every
tensor (a full copy of the model on its device while it sends, as slime's colocated path).
A push then checks every server's ``/get_weight_version``, as the distributed sync does.
A ``WeightSync`` (``engines.weight_sync``), opened by ``SGLangServerEngine.weight_sync`` for a
colocated run; a restarted engine gets the current version from its bundle-mate the same way
(the other engines are not sent it again).
"""

from __future__ import annotations

import time
from typing import Any

import ray

from loongsage.errors import ConfigError
from loongsage.engines.weight_sync import engine_values
from loongsage.transfer import TransferConfig, WeightSyncError

_SENDER: dict[str, Any] = {}


def actor_push(engine: Any, version: int, url: str | None, tp_size: int, bucket_bytes: int,
               timeout_s: float) -> dict[str, Any]:
    """In a train rank's actor: gather, and send ``version`` to the server at ``url`` (None:
    gather only), one entry per TP rank of it."""
    from loongsage.engines.sglang.tensor_sender import SGLangTensorSender

    start = time.perf_counter()
    named = engine.named_tensors(include_tied=False)
    tensors = list(engine.parallel.full_tensors(named, lambda name: url is not None))
    if url is None:
        return {"seconds": time.perf_counter() - start, "bytes": 0, "buckets": 0, "requests": 0}
    sender = _SENDER.get(url)
    if sender is None:
        sender = _SENDER[url] = SGLangTensorSender(url, tp_size=tp_size, bucket_bytes=bucket_bytes,
                                                   device=str(engine.device), timeout_s=timeout_s)
    before = sender.requests
    buckets = sender.sync(tensors, version)
    size = sum(t.numel() * t.element_size() for _, t in tensors)
    return {"seconds": time.perf_counter() - start, "bytes": size, "buckets": buckets,
            "requests": sender.requests - before}


def actor_close_senders(engine: Any) -> None:
    while _SENDER:
        _SENDER.popitem()[1].close()


class TensorWeightSync:
    def __init__(self, trainers: Any, rollout_actors: list, config: TransferConfig) -> None:
        if len(rollout_actors) > trainers.world_size:
            raise ConfigError("rollout.num_engines", (
                f"{len(rollout_actors)} colocated SGLang engines, but each gets its weights from "
                f"the train rank in its bundle and there are {trainers.world_size} "
                "(train.dp_size): use at most that many engines, or placement.mode=disaggregated "
                "(weights over /update_weights_from_distributed)"))
        self.trainers, self.rollout_actors, self.config = trainers, rollout_actors, config
        self.last: list[dict[str, Any]] = []

    def _send(self, version: int, targets: set[int]) -> None:
        servers = engine_values(self.rollout_actors, lambda engine: (engine.url, engine.tp_size))
        dead = sorted(i for i in targets if servers[i] is None)
        if dead:
            raise WeightSyncError(version, None, f"the actors of engines {dead} died")
        refs = [actor.run.remote(actor_push, version, servers[rank][0] if rank in targets else None,
                                 servers[rank][1] if rank in targets else 1, self.config.bucket_bytes,
                                 self.config.timeout_s)
                for rank, actor in enumerate(self.trainers.actors)]
        try:
            self.last = ray.get(refs)
        except ray.exceptions.RayTaskError as err:
            raise WeightSyncError(version, None, f"the tensor update failed: {err}") from err
        behind = {i: v for i, v in enumerate(self.versions()) if i in targets and v != version}
        if behind:
            raise WeightSyncError(version, None, f"engines {behind} (index: version) did not apply it")

    def push(self, version: int) -> dict[str, float]:
        """Send the trainers' weights as ``version``; raise if any server did not apply it."""
        self._send(version, set(range(len(self.rollout_actors))))
        return self.metrics()

    def replace_engine(self, idx: int, actor: Any, version: int) -> int:
        """A restarted server: its bundle-mate sends it ``version`` (the others keep theirs)."""
        self.rollout_actors[idx] = actor
        self._send(version, {idx})
        return version

    def versions(self) -> list[int | str | None]:
        return engine_values(self.rollout_actors, lambda engine: engine.weight_version)

    def metrics(self) -> dict[str, float]:
        return {"perf/weight_sync_gb": sum(r["bytes"] for r in self.last) / 1e9,
                "perf/weight_sync_s": max((r["seconds"] for r in self.last), default=0.0),
                "perf/weight_sync_senders": float(sum(1 for r in self.last if r["requests"])),
                "perf/weight_sync_tensor_requests": float(sum(r["requests"] for r in self.last))}

    def close(self) -> None:
        for actor in self.trainers.actors:
            try:
                ray.get(actor.run.remote(actor_close_senders), timeout=30)
            except ray.exceptions.RayError:
                continue
