"""Sender side of SGLang's ``/update_weights_from_tensor`` for colocated engines: only handles
cross HTTP, the server maps the trainer's memory.

Wire format, as SGLang reads it (``python/sglang/srt/managers/io_struct.py``,
``UpdateWeightsFromTensorReqInput``; ``python/sglang/srt/managers/tp_worker.py``,
``update_weights_from_tensor``; ``python/sglang/srt/model_executor/model_runner.py``):
``{serialized_named_tensors: [one entry per TP rank], load_format, flush_cache,
abort_all_requests, weight_version}``. TP rank r deserializes entry r into a list of
``(name, tensor)`` and loads it (``load_format`` None: the model's ``load_weights``; "direct":
a plain copy per parameter). An entry is what SGLang's ``MultiprocessingSerializer.serialize(obj,
output_str=True)`` makes (``python/sglang/srt/utils/common.py``): ``multiprocessing``'s
``ForkingPickler`` dump, base64. With torch's reductions registered in ``ForkingPickler``, a
tensor pickles to a handle, not to its bytes:

* CUDA: a CUDA IPC handle of the tensor's allocation. Like SGLang's
  ``monkey_patch_torch_reductions`` (``python/sglang/srt/utils/patch_torch.py``) the device is
  sent as the GPU's UUID, so a server that numbers its GPUs differently maps the right one;
  done here per pickler (its dispatch table), without patching torch.
* CPU: the tensor's storage in shared memory. Under torch's default ``file_descriptor``
  strategy that is a file descriptor only a related process can receive; under
  ``file_system`` (switched on while an entry is pickled) it is a named segment that any
  process on the host maps through torch's shm manager. That is the CPU stand-in's path.

Each bucket (``distributed_sender.buckets_by_bytes``, as the distributed sync cuts them) is
copied into one fresh flat buffer (shared memory on CPU, device memory on a GPU) and sent as
views of it, one handle per bucket; the buffer is kept until the server answered, and a new
one is allocated per bucket: slime (``slime/backends/megatron_utils/update_weight/
update_weight_from_tensor.py``, ``_build_flattened_tensor_data``) found that SGLang may answer
before its GPU copies out of a reused buffer finished. slime sends ``load_format=
"flattened_bucket"`` (one flat tensor plus SGLang's ``FlattenedTensorMetadata`` objects, which
only unpickle where SGLang is installed); here the views go as plain ``(name, tensor)``
lists (``load_format`` None), which every SGLang version reads. ``flush_cache`` is set on the
last bucket of a version only, as slime and the distributed sync do.

A server that answers with an error before it mapped an entry leaves that bucket's shared
segment to torch's shm manager, which unlinks it when the trainer's process exits.
"""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from multiprocessing.reduction import ForkingPickler
from typing import Iterator

import httpx
import torch
import torch.multiprocessing as torch_mp
from torch.multiprocessing.reductions import reduce_tensor

from loongsage.transfer.bucketing import ALIGN, as_bytes, copy_bytes
from loongsage.transfer.frames import WeightSyncError
from loongsage.engines.sglang.distributed_sender import buckets_by_bytes

_DEVICE_ARG = 6  # the device in the arguments of torch's ``rebuild_cuda_tensor``
_STRATEGY_LOCK = threading.Lock()


@contextmanager
def file_system_sharing() -> Iterator[None]:
    """torch's ``file_system`` sharing strategy for the duration (restored afterwards)."""
    with _STRATEGY_LOCK:
        previous = torch_mp.get_sharing_strategy()
        torch_mp.set_sharing_strategy("file_system")
        try:
            yield
        finally:
            torch_mp.set_sharing_strategy(previous)


def _reduce_with_device_uuid(tensor: torch.Tensor):
    rebuild, args = reduce_tensor(tensor)
    if tensor.is_cuda:
        uuid = str(torch.cuda.get_device_properties(args[_DEVICE_ARG]).uuid)
        args = (*args[:_DEVICE_ARG], uuid, *args[_DEVICE_ARG + 1:])
    return rebuild, args


def serialize_named_tensors(named_tensors: Sequence[tuple[str, torch.Tensor]]) -> str:
    """One ``serialized_named_tensors`` entry: ``ForkingPickler`` dump of the ``(name, tensor)``
    list, base64, as SGLang's ``MultiprocessingSerializer.serialize(output_str=True)``. CPU
    tensors must already live in shared memory (``shared_bucket``), or torch copies them there."""
    buffer = io.BytesIO()
    with file_system_sharing():
        pickler = ForkingPickler(buffer)
        for kind in (torch.Tensor, torch.nn.Parameter):
            pickler.dispatch_table[kind] = _reduce_with_device_uuid
        pickler.dump([(str(name), tensor) for name, tensor in named_tensors])
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _flat_buffer(nbytes: int, device: torch.device) -> torch.Tensor:
    if device.type != "cpu":
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    with file_system_sharing():
        storage = torch.UntypedStorage._new_shared(max(nbytes, 1))
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (nbytes,), (1,))


def shared_bucket(bucket: Sequence[tuple[str, torch.Tensor]], device: str | torch.device
                  ) -> list[tuple[str, torch.Tensor]]:
    """The bucket's tensors copied into one new flat buffer (a shared-memory segment on CPU,
    device memory on a GPU), as views of it; each view starts ``ALIGN``-aligned."""
    device = torch.device(device)
    offsets, end = [], 0
    for _, tensor in bucket:
        offsets.append(end)
        end = -(-(end + tensor.numel() * tensor.element_size()) // ALIGN) * ALIGN
    flat = _flat_buffer(end, device)
    views = []
    for (name, tensor), offset in zip(bucket, offsets):
        raw = as_bytes(tensor.detach())
        piece = flat[offset:offset + raw.numel()]
        copy_bytes(piece, raw.to(device) if raw.device != device else raw)
        views.append((name, piece.view(tensor.dtype).view(tensor.shape)))
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()  # the server reads it from another process
    return views


def tensor_request(entries: Sequence[str], *, version: int, flush_cache: bool) -> dict:
    """The ``/update_weights_from_tensor`` body for one bucket (``entries``: one per TP rank)."""
    return {"serialized_named_tensors": list(entries), "load_format": None,
            "flush_cache": flush_cache, "abort_all_requests": False, "weight_version": str(version)}


class SGLangTensorSender:
    """A train rank pushing weights to the SGLang-compatible server on its own device."""

    def __init__(self, url: str, *, tp_size: int = 1, bucket_bytes: int = 512 << 20,
                 device: str = "cpu", timeout_s: float = 600.0):
        self.url, self.tp_size, self.bucket_bytes = url.rstrip("/"), tp_size, bucket_bytes
        self.device, self.requests = device, 0
        self._http = httpx.Client(timeout=timeout_s)

    def _post(self, body: dict) -> None:
        response = self._http.post(f"{self.url}/update_weights_from_tensor", json=body)
        data = response.json() if response.headers.get("content-type", "").startswith(
            "application/json") else {}
        if response.status_code != 200 or (isinstance(data, dict) and data.get("success") is False):
            raise RuntimeError(f"{self.url}/update_weights_from_tensor: HTTP "
                               f"{response.status_code}: {response.text[:2000]}")

    def sync(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """Send one version, bucket by bucket; returns the number of buckets. Errors name the
        version and the bucket; the server keeps serving its previous version."""
        buckets = buckets_by_bytes(named_tensors, self.bucket_bytes)
        index, bucket = 0, next(buckets, None)
        while bucket is not None:
            following = next(buckets, None)
            try:
                views = shared_bucket(bucket, self.device)
                entry = serialize_named_tensors(views)
                self._post(tensor_request([entry] * self.tp_size, version=version,
                                          flush_cache=following is None))
            except (RuntimeError, ValueError, httpx.HTTPError) as exc:
                raise WeightSyncError(version, index, str(exc)) from exc
            del views  # the server answered: it holds its own mapping or copy now
            self.requests += 1
            index, bucket = index + 1, following
        return index

    def close(self) -> None:
        self._http.close()
