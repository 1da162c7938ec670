"""Server side of SGLang's ``/update_weights_from_tensor``, for engines that are not SGLang.

``TensorWeightUpdates.update`` takes SGLang's request body (``tensor_sender`` describes it and
sends it): ``serialized_named_tensors`` (one entry per TP rank; the embedded engine has
one), ``load_format`` (None or "direct": plain ``(name, tensor)`` lists), ``flush_cache``,
``weight_version``. Each entry is unpickled into tensors that map the sender's memory (shared
memory on a CPU; a CUDA IPC handle on a GPU, whose device may be given as the GPU's UUID, as
SGLang's patched reductions send it) and handed to any ``apply(named_tensors, version) ->
version`` callable; the embedded rollout engine mounts it (``engines/embedded_rollout/server.py``).

Deviations from SGLang, on purpose:

* SGLang's ``MultiprocessingSerializer.deserialize`` unpickles with an allow-list of module
  prefixes (``torch.``, ``builtins.``, ``collections.`` and more, ``SafeUnpickler`` in
  ``python/sglang/srt/utils/common.py``). Here only the exact globals torch's tensor
  reductions emit are allowed (the rebuild functions, ``torch.Tensor``, ``torch.Size``, the
  storage classes, dtypes), so a payload can name no other callable.
* As for the distributed update (``distributed_receiver``), the requests of one ``weight_version``
  are held until the one with ``flush_cache=True`` and applied together, so no request sees a
  half-updated model. The held tensors are the mapped views themselves (no staging copy):
  the sender's shared segment stays alive while they are held, and goes when the version is
  applied or dropped. A request that fails (undecodable entry, wrong number of entries,
  unknown name, wrong shape) fails the whole version: nothing of it is applied.
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch.multiprocessing import reductions

from loongsage.engines.sglang.distributed_receiver import (
    ApplyVersion,
    UpdateRequestError,
    request_version,
)

LOAD_FORMATS = (None, "direct")
_DEVICE_ARG = 6  # the device in the arguments of torch's ``rebuild_cuda_tensor``
_REDUCTIONS = "torch.multiprocessing.reductions"
_ALLOWED = {(_REDUCTIONS, "rebuild_tensor"), (_REDUCTIONS, "rebuild_typed_storage"),
            (_REDUCTIONS, "rebuild_storage_filename"), (_REDUCTIONS, "rebuild_storage_empty"),
            ("torch", "Tensor"), ("torch", "Size"), ("torch.nn.parameter", "Parameter"),
            ("torch.storage", "UntypedStorage"), ("torch.storage", "TypedStorage")}


def _device_index(device: int | str) -> int:
    if isinstance(device, int):
        return device
    for index in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(index).uuid) == device:
            return index
    raise ValueError(f"no visible GPU has the UUID {device!r} the tensor was sent from")


def _rebuild_cuda_tensor(*args):
    args = (*args[:_DEVICE_ARG], _device_index(args[_DEVICE_ARG]), *args[_DEVICE_ARG + 1:])
    return reductions.rebuild_cuda_tensor(*args)


class _WeightUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) == (_REDUCTIONS, "rebuild_cuda_tensor"):
            return _rebuild_cuda_tensor
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) == (_REDUCTIONS, "rebuild_storage_fd"):
            raise pickle.UnpicklingError("a tensor shared by file descriptor (torch's default "
                                         "'file_descriptor' strategy) cannot cross HTTP: pickle "
                                         "it under the 'file_system' strategy")
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a weight payload (only "
                                     f"torch's tensor reductions are)")


def deserialize_named_tensors(entry: str) -> list[tuple[str, torch.Tensor]]:
    """One entry back into ``(name, tensor)`` pairs; ``ValueError`` says what is wrong."""
    try:
        raw = base64.b64decode(entry.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ValueError(f"not base64: {exc}") from None
    try:
        items = _WeightUnpickler(io.BytesIO(raw)).load()
    except Exception as exc:  # a payload can fail in any rebuild function: all are bad input
        raise ValueError(f"not a ForkingPickler payload of tensors: {type(exc).__name__}: "
                         f"{exc}") from None
    if not isinstance(items, list) or not all(
            isinstance(it, tuple) and len(it) == 2 and isinstance(it[0], str)
            and isinstance(it[1], torch.Tensor) for it in items):
        raise ValueError("expected a list of (name, tensor) pairs")
    return items


@dataclass
class _Pending:
    version: int | None
    requests: int = 0
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


class TensorWeightUpdates:
    """``/update_weights_from_tensor`` for one engine of one TP rank (the embedded engine).

    ``shapes`` maps every parameter the engine accepts to its shape (checked per request,
    before anything is held for apply). Blocks in ``apply``: call it from a worker thread.
    """

    def __init__(self, apply: ApplyVersion, shapes: Mapping[str, Sequence[int]]) -> None:
        self.apply = apply
        self.shapes = {name: tuple(shape) for name, shape in shapes.items()}
        self._pending: _Pending | None = None
        self._lock = threading.Lock()

    def _entries(self, body: Mapping) -> list[str]:
        if body.get("load_format") not in LOAD_FORMATS:
            raise UpdateRequestError("load_format", f"expected one of {list(LOAD_FORMATS)} "
                                     f"((name, tensor) lists), got {body.get('load_format')!r}")
        entries = body.get("serialized_named_tensors")
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise UpdateRequestError("serialized_named_tensors", "expected a list of base64 "
                                     "strings, one per TP rank")
        if len(entries) != 1:
            raise UpdateRequestError("serialized_named_tensors", f"expected one entry per TP "
                                     f"rank (this engine has one), got {len(entries)}")
        if not isinstance(body.get("flush_cache", True), bool):
            raise UpdateRequestError("flush_cache", f"expected true or false, got "
                                     f"{body['flush_cache']!r}")
        return entries

    def _checked(self, entry: str, where: str) -> list[tuple[str, torch.Tensor]]:
        try:
            named = deserialize_named_tensors(entry)
        except ValueError as exc:
            raise UpdateRequestError("serialized_named_tensors", f"{where}: {exc}") from None
        for name, tensor in named:
            expected = self.shapes.get(name)
            if expected is None:
                raise UpdateRequestError("serialized_named_tensors",
                                         f"{where}: unknown parameter {name!r}")
            if tuple(tensor.shape) != expected:
                raise UpdateRequestError("serialized_named_tensors", f"{where}: {name!r} has "
                                         f"shape {list(tensor.shape)}, the model expects "
                                         f"{list(expected)}")
        return named

    def update(self, body: Mapping) -> dict:
        """One request; applies the version on the one with ``flush_cache`` (the default)."""
        entries, version = self._entries(body), request_version(body)
        with self._lock:
            if self._pending is None or self._pending.version != version:
                self._pending = _Pending(version)
            pending = self._pending
            pending.requests += 1
            where = (f"update_weights_from_tensor request {pending.requests} of weight version "
                     f"{version}")
            try:
                named = self._checked(entries[0], where)
            except UpdateRequestError as exc:
                self._pending = None
                raise UpdateRequestError(exc.field, f"{exc}; version not applied") from None
            pending.tensors.update(named)
            if not body.get("flush_cache", True):
                return {"success": True, "message": f"{where}: holding {len(pending.tensors)} "
                        f"tensors"}
            self._pending = None
            new = self.apply(list(pending.tensors.items()), version)
            return {"success": True, "message": f"{where}: applied {len(pending.tensors)} "
                    f"tensors", "weight_version": str(new)}
