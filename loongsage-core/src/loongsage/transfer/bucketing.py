"""Packing named tensors into contiguous buckets, and putting them back together.

The sender turns each named tensor into a *wire item* (its raw bytes, or a sparse delta) and
copies items into fixed-size bucket buffers it does not own (warm shared-memory slots, GPU
slots): one copy per byte, no per-tensor allocation. An item that does not fit in the room left
is split across as many buckets as it needs, so one tensor may be larger than a bucket. Each
bucket gets one `BucketMeta` frame listing the pieces it carries. Piece offsets are 64-byte
aligned so a receiver may view them in place as typed tensors.

The receiver side (`Reassembler`) copies pieces into persistent staging tensors and checks a
version is complete (every bucket, every byte of every item, checksums) before anything may be
applied. Deviation from baidu-baige/LoongSage (`coda/transfer_mesh/`): baidu-baige/LoongSage never
splits a tensor (a tensor larger than its 1 GiB bucket is a hard error) and has no end-of-version
verification.
"""

from __future__ import annotations

import ctypes
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from loongsage.transfer.frames import (
    ENCODING_DENSE,
    ENCODING_SPARSE32,
    ENCODING_SPARSE64,
    FRAME_BUCKET,
    BucketMeta,
    TensorSpec,
)

ALIGN = 64
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
SPARSE_INDEX = {ENCODING_SPARSE32: torch.int32, ENCODING_SPARSE64: torch.int64}


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to the next multiple of ``ALIGN`` (where a bucket's next piece starts)."""
    return -(-nbytes // ALIGN) * ALIGN


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"TensorSpec.dtype: expected a torch dtype name, got {name!r}")
    return dtype


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a tensor's storage (copying only if it is not contiguous)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def as_int(tensor: torch.Tensor) -> torch.Tensor:
    """A flat integer view with the element size of `tensor`, for bitwise comparison."""
    return tensor.detach().contiguous().reshape(-1).view(_INT_VIEW[tensor.element_size()])


@dataclass(frozen=True)
class WireItem:
    """One named thing to send: a tensor's bytes, or its sparse delta blob."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    encoding: str
    data: torch.Tensor
    count: int = 0

    @property
    def nbytes(self) -> int:
        return self.data.numel()


def dense_item(name: str, tensor: torch.Tensor) -> WireItem:
    return WireItem(name, dtype_name(tensor.dtype), tuple(tensor.shape), ENCODING_DENSE,
                    as_bytes(tensor))


def copy_bytes(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy between two equally long contiguous uint8 tensors.

    CPU to CPU goes through libc memmove (GIL released): on the 2-core reference machine it
    runs 2-3x faster than torch's uint8 `copy_`, which splits the work across threads that
    the other process of the transfer needs. Nothing is copied where ``src`` already is
    ``dst`` (a sender whose tensors live in its ring: ``TransferMesh.place_in_ring``).
    """
    if dst.data_ptr() == src.data_ptr() and dst.device == src.device:
        return
    if dst.device.type == "cpu" and src.device.type == "cpu":
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), dst.numel())
    else:
        dst.copy_(src, non_blocking=dst.device.type == "cuda" and src.device.type == "cpu")


def ring_offsets(sizes: Iterable[int], bucket_bytes: int) -> list[int]:
    """Where ``BucketPacker`` puts each item of a full version in a ring that holds all of it:
    the offset of the item's first byte from the start of slot 0. Slots are consecutive in one
    segment and an item split across buckets goes on at the next slot's start, so every item
    is one contiguous range there."""
    offsets: list[int] = []
    bucket = used = 0
    for nbytes in sizes:
        if used >= bucket_bytes and nbytes:
            bucket, used = bucket + 1, 0
        start = bucket * bucket_bytes + used
        offsets.append(start)
        bucket, end = divmod(start + nbytes, bucket_bytes)
        used = min(aligned(end), bucket_bytes)
    return offsets


def _crc(payload: torch.Tensor) -> int:
    return zlib.crc32(memoryview(payload.cpu().numpy()))


class BucketPacker:
    """Fills bucket buffers handed out by `acquire(slot)` and yields one frame per bucket.

    `acquire` must return a uint8 tensor of at least `bucket_bytes` for slot `index % num_slots`
    and may block until receivers released that slot; the packer asks for a slot only when it
    has bytes to put in it, so the previous bucket is in flight while the next is packed.
    """

    def __init__(self, *, bucket_bytes: int, num_slots: int,
                 acquire: Callable[[int], torch.Tensor], version: int, sender_rank: int,
                 base_version: int | None, checksum: bool):
        self.bucket_bytes, self.num_slots, self.acquire = bucket_bytes, num_slots, acquire
        self.version, self.sender_rank, self.base_version = version, sender_rank, base_version
        self.checksum = checksum
        self.num_buckets = 0
        self.payload_bytes = 0

    def pack(self, items: Iterable[WireItem]) -> Iterator[tuple[BucketMeta, torch.Tensor]]:
        buf: torch.Tensor | None = None
        specs: list[TensorSpec] = []
        used = end = 0
        for item in items:
            pos = 0
            while True:
                if used >= self.bucket_bytes and pos < item.nbytes:
                    yield self._frame(buf, specs, end)
                    buf, specs, used, end = None, [], 0, 0
                if buf is None:
                    buf = self.acquire(self.num_buckets % self.num_slots)
                n = min(self.bucket_bytes - used, item.nbytes - pos)
                if n:
                    copy_bytes(buf[used:used + n], item.data[pos:pos + n])
                specs.append(TensorSpec(item.name, item.dtype, item.shape, item.encoding,
                                        item.nbytes, pos, used, n, item.count))
                pos += n
                end = used + n
                used = min(aligned(end), self.bucket_bytes)
                if pos >= item.nbytes:
                    break
        if specs:
            yield self._frame(buf, specs, end)

    def _frame(self, buf: torch.Tensor, specs: list[TensorSpec], nbytes: int
               ) -> tuple[BucketMeta, torch.Tensor]:
        index = self.num_buckets
        meta = BucketMeta(
            kind=FRAME_BUCKET, version=self.version, sender_rank=self.sender_rank, index=index,
            specs=tuple(specs), nbytes=nbytes, slot=index % self.num_slots,
            checksum=_crc(buf[:nbytes]) if self.checksum else None,
            base_version=self.base_version)
        self.num_buckets += 1
        self.payload_bytes += nbytes
        return meta, buf


class IncompleteVersion(Exception):
    """Raised by the reassembler when a bucket or a version fails verification."""


class Arrivals:
    """Which buckets of one version arrived and how many payload bytes: both reassemblers'
    per-bucket verification (no duplicates, checksum) and end-of-version completeness."""

    def __init__(self) -> None:
        self.buckets: set[int] = set()
        self.payload_bytes = 0

    def accept(self, meta: BucketMeta, payload: torch.Tensor) -> None:
        """Record one bucket; ``IncompleteVersion`` if it came twice or fails its checksum."""
        if meta.index in self.buckets:
            raise IncompleteVersion(f"bucket {meta.index} arrived twice")
        if meta.checksum is not None and _crc(payload[:meta.nbytes]) != meta.checksum:
            raise IncompleteVersion(f"bucket {meta.index} checksum mismatch")
        self.buckets.add(meta.index)
        self.payload_bytes += meta.nbytes

    def check_complete(self, num_buckets: int, total_bytes: int) -> None:
        """``IncompleteVersion`` unless every bucket and every announced byte arrived."""
        missing = sorted(set(range(num_buckets)) - self.buckets)
        if missing:
            raise IncompleteVersion(f"buckets {missing[:8]} of {num_buckets} never arrived")
        if self.payload_bytes != total_bytes:
            raise IncompleteVersion(f"{self.payload_bytes} payload bytes arrived, sender "
                                    f"announced {total_bytes}")


class Reassembler:
    """Receiver-side assembly of one weight version into persistent staging tensors.

    `staging` outlives versions: after a full version it mirrors the applied weights, which is
    what sparse deltas patch (unless the receiver frees it: a zero-copy receiver does, see
    `receiver.py`). Dense pieces are written straight into staging (a failed version
    therefore invalidates the mirror, and the receiver asks for a full version next); sparse
    blobs are buffered and patched in only once the whole version verified.
    """

    def __init__(self, staging: dict[str, torch.Tensor], device: str = "cpu"):
        self.staging, self.device = staging, device
        self.reset()

    def reset(self) -> None:
        self.received: dict[str, int] = {}
        self.expected: dict[str, int] = {}
        self.sparse: dict[str, tuple[TensorSpec, torch.Tensor]] = {}
        self.arrivals = Arrivals()

    def _target(self, spec: TensorSpec) -> torch.Tensor:
        dtype = dtype_from_name(spec.dtype)
        current = self.staging.get(spec.name)
        if current is None or current.dtype != dtype or tuple(current.shape) != spec.shape:
            current = torch.empty(spec.shape, dtype=dtype, device=self.device)
            self.staging[spec.name] = current
        return current.view(-1).view(torch.uint8)

    def write(self, meta: BucketMeta, payload: torch.Tensor) -> None:
        self.arrivals.accept(meta, payload)
        for spec in meta.specs:
            piece = payload[spec.offset:spec.offset + spec.nbytes]
            if spec.encoding in SPARSE_INDEX:
                _, blob = self.sparse.get(spec.name) or (spec, torch.empty(
                    spec.item_nbytes, dtype=torch.uint8, device=self.device))
                self.sparse[spec.name] = (spec, blob)
                copy_bytes(blob[spec.item_offset:spec.item_offset + spec.nbytes], piece)
            elif spec.encoding == ENCODING_DENSE:
                target = self._target(spec)
                if target.numel() != spec.item_nbytes:
                    raise IncompleteVersion(f"tensor {spec.name!r}: {spec.item_nbytes} bytes sent "
                                            f"for shape {spec.shape} of {spec.dtype}")
                copy_bytes(target[spec.item_offset:spec.item_offset + spec.nbytes], piece)
            else:
                raise IncompleteVersion(f"tensor {spec.name!r}: unknown encoding {spec.encoding!r}")
            self.received[spec.name] = self.received.get(spec.name, 0) + spec.nbytes
            self.expected[spec.name] = spec.item_nbytes

    def finish(self, num_buckets: int, total_bytes: int) -> list[str]:
        """Verify the version and patch sparse deltas in; returns the names it carried."""
        self.arrivals.check_complete(num_buckets, total_bytes)
        short = [n for n, size in self.expected.items() if self.received[n] != size]
        if short:
            raise IncompleteVersion(f"tensors {short[:8]} arrived incomplete")
        for name, (spec, blob) in self.sparse.items():
            if name not in self.staging:
                raise IncompleteVersion(f"delta for {name!r} but no base tensor is held")
            index_dtype = SPARSE_INDEX[spec.encoding]
            split = spec.count * index_dtype.itemsize
            idx = blob[:split].view(index_dtype)
            vals = blob[split:].view(dtype_from_name(spec.dtype))
            target = self.staging[name]
            if target.device.type == "cpu":  # numpy takes int32 indices without a cast
                np.put(as_int(target).numpy(), idx.numpy(), as_int(vals).numpy())
            else:
                target.view(-1)[idx.long()] = vals
        return list(self.expected)

