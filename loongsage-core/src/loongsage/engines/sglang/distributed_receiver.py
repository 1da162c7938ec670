"""Server side of SGLang's distributed weight update, for engines that are not SGLang.

`DistributedWeightUpdates` implements the bodies of `/init_weights_update_group`,
`/update_weights_from_distributed` and `/destroy_weights_update_group` (sgl-project/sglang
`http_server.py`) over any `apply(named_tensors, version) -> version` callable; the embedded
rollout engine mounts it (`engines/embedded_rollout/server.py`), which speaks SGLang's API, and
`distributed_sender.SGLangDistributedSender` drives it.

Per update request the server posts one broadcast per listed `(name, dtype, shape)`, in order,
from rank 0 of a process group it joined with `distributed_sender.join_group` (gloo on CPU,
NCCL on GPU; never the default group). Every listed tensor is received even when the request is invalid, so
the group stays in step with the sender.

Deviation from SGLang, on purpose: SGLang loads each request's tensors into the model at once,
so a multi-request update is visible half-applied between requests. Here the requests of one
`weight_version` are buffered (in staging tensors reused across versions) until the request
with `flush_cache=True`, which `SGLangDistributedSender`, slime and verl set on the last bucket
only; then `apply` runs once, so requests never see a half-updated model. A request that fails
(unknown name, wrong shape, broken group) fails the whole version: nothing of it is applied,
the engine keeps serving the previous version, and the error names the request. A request
carrying a different `weight_version` than the buffered one drops the buffered, unfinished
version (its sender gave up on it). Copies per tensor on the receiver: broadcast into staging,
staging into the parameter (`apply`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from loongsage.transfer.bucketing import dtype_from_name
from loongsage.engines.sglang.distributed_sender import join_group

ApplyVersion = Callable[[list[tuple[str, torch.Tensor]], "int | None"], int]
_BACKENDS = ("gloo", "nccl")


class UpdateRequestError(ValueError):
    """A malformed or failed request; `field` names the offending request field."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass
class _Pending:
    version: int | None
    requests: int = 0
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    error: str = ""


def _require(body: Mapping, key: str, kind: type | tuple[type, ...], what: str):
    value = body.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise UpdateRequestError(key, f"expected {what}, got {value!r}")
    return value


def request_version(body: Mapping) -> int | None:
    raw = body.get("weight_version")
    if raw is None:
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise UpdateRequestError("weight_version", f"expected an integer (or its decimal "
                                 f"string), got {raw!r}") from None


def _specs(body: Mapping) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    if "names" not in body and "name" in body:  # SGLang's older single-tensor request
        body = {"names": [body["name"]], "dtypes": [body.get("dtype")],
                "shapes": [body.get("shape")]}
    names = _require(body, "names", list, "a list of parameter names")
    dtypes = _require(body, "dtypes", list, "a list of dtype names, one per name")
    shapes = _require(body, "shapes", list, "a list of shapes, one per name")
    if not len(names) == len(dtypes) == len(shapes):
        raise UpdateRequestError("names", f"names, dtypes and shapes must have equal lengths, "
                                 f"got {len(names)}, {len(dtypes)} and {len(shapes)}")
    specs = []
    for i, (name, dtype, shape) in enumerate(zip(names, dtypes, shapes)):
        if not isinstance(name, str) or not name:
            raise UpdateRequestError("names", f"entry {i}: expected a parameter name, got {name!r}")
        try:
            torch_dtype = dtype_from_name(str(dtype).removeprefix("torch."))
        except (KeyError, ValueError):
            raise UpdateRequestError("dtypes", f"entry {i} ({name}): unsupported dtype "
                                     f"{dtype!r}") from None
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise UpdateRequestError("shapes", f"entry {i} ({name}): expected a list of "
                                     f"non-negative ints, got {shape!r}")
        specs.append((name, torch_dtype, tuple(shape)))
    return specs


class DistributedWeightUpdates:
    """The three endpoints' logic for one engine (one rank: the embedded engine has no TP).

    `shapes` maps every parameter the engine accepts to its shape (checked per request, before
    anything is buffered for apply); `device` is where broadcasts land ("cpu" for gloo).
    Methods block (group rendezvous, broadcasts): call them from a worker thread.
    """

    def __init__(self, apply: ApplyVersion, shapes: Mapping[str, Sequence[int]], *,
                 device: str | torch.device = "cpu", timeout_s: float = 600.0):
        self.apply = apply
        self.shapes = {name: tuple(shape) for name, shape in shapes.items()}
        self.device = torch.device(device)
        self.timeout_s = timeout_s
        self.groups: dict[str, object] = {}
        self.staging: dict[str, torch.Tensor] = {}
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()

    def init_group(self, body: Mapping) -> dict:
        address = _require(body, "master_address", str, "a host name or IP")
        port = _require(body, "master_port", int, "a TCP port")
        rank = _require(body, "rank_offset", int, "this engine's rank in the group (>= 1)")
        world = _require(body, "world_size", int, "the group size")
        name = _require(body, "group_name", str, "a group name")
        backend = body.get("backend", "nccl")
        if backend not in _BACKENDS:
            raise UpdateRequestError("backend", f"expected one of {list(_BACKENDS)}, got "
                                     f"{backend!r}")
        if not 1 <= rank < world:
            raise UpdateRequestError("rank_offset", f"expected 1 <= rank_offset < world_size "
                                     f"({world}), got {rank}")
        if name in self.groups:
            raise UpdateRequestError("group_name", f"group {name!r} already exists; call "
                                     f"/destroy_weights_update_group first")
        try:
            group = join_group(master_address=address, master_port=port, rank=rank,
                               world_size=world, group_name=name, backend=backend,
                               timeout_s=self.timeout_s)
        except (RuntimeError, ValueError, TimeoutError) as exc:
            raise UpdateRequestError("master_address", f"joining group {name!r} at "
                                     f"{address}:{port} as rank {rank}/{world} failed: "
                                     f"{exc}") from exc
        self.groups[name] = group
        return {"success": True, "message": f"joined {name!r} as rank {rank} of {world}"}

    def update(self, body: Mapping) -> dict:
        """One `/update_weights_from_distributed` request; applies on the flushing request."""
        name = body.get("group_name", "weight_update_group")
        group = self.groups.get(name)
        if group is None:
            raise UpdateRequestError("group_name", f"no weights update group {name!r}; call "
                                     f"/init_weights_update_group first")
        if body.get("load_format") is not None:
            raise UpdateRequestError("load_format", f"only per-tensor broadcasts (null) are "
                                     f"supported, got {body['load_format']!r}")
        specs, version = _specs(body), request_version(body)
        with self._lock:
            pending = self._pending.get(name)
            if pending is None or pending.version != version:
                pending = self._pending[name] = _Pending(version)
            pending.requests += 1
            where = (f"update_weights_from_distributed request {pending.requests} of weight "
                     f"version {version}")
            for tensor_name, dtype, shape in specs:
                buffer = self._buffer(tensor_name, dtype, shape)
                try:
                    dist.broadcast(buffer, src=0, group=group)
                except (RuntimeError, ValueError) as exc:
                    self._pending.pop(name, None)
                    raise UpdateRequestError("names", f"{where}: broadcast of {tensor_name!r} "
                                             f"failed, nothing applied: {exc}") from exc
                expected = self.shapes.get(tensor_name)
                if pending.error:
                    continue
                if expected is None:
                    pending.error = f"{where}: unknown parameter {tensor_name!r}"
                elif expected != shape:
                    pending.error = (f"{where}: {tensor_name!r} has shape {list(shape)}, the "
                                     f"model expects {list(expected)}")
                else:
                    pending.tensors[tensor_name] = buffer
            if pending.error:
                if body.get("flush_cache", True):
                    self._pending.pop(name, None)
                raise UpdateRequestError("names", f"{pending.error}; version not applied")
            if not body.get("flush_cache", True):
                return {"success": True, "message": f"{where}: buffered "
                        f"{len(pending.tensors)} tensors"}
            self._pending.pop(name, None)
            new = self.apply(list(pending.tensors.items()), version)
            return {"success": True, "message": f"{where}: applied {len(pending.tensors)} "
                    f"tensors", "weight_version": str(new)}

    def _buffer(self, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        current = self.staging.get(name)
        if current is None or current.dtype != dtype or tuple(current.shape) != shape:
            current = self.staging[name] = torch.empty(shape, dtype=dtype, device=self.device)
        return current

    def destroy(self, body: Mapping) -> dict:
        name = body.get("group_name", "weight_update_group")
        group = self.groups.pop(name, None)
        if group is None:
            raise UpdateRequestError("group_name", f"no weights update group {name!r}")
        with self._lock:
            self._pending.pop(name, None)
        dist.destroy_process_group(group)
        return {"success": True, "message": f"destroyed {name!r}"}
