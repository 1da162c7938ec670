"""Zero-copy assembly of one version from the shared-memory arena (same-host receivers).

The default `Reassembler` copies every bucket out of its slot into staging tensors, because
slots are reused within a version. When a whole version fits in the sender's ring
(`num_slots * bucket_bytes` >= version bytes) no slot is reused before the version is applied,
and since the slots are consecutive views of one segment (`shm.py`), every tensor, even one
split across buckets, is contiguous in that segment. `ArenaAssembler` then only records where
each tensor starts and verifies it is whole; `named_views()` returns views of the arena that
the receiver hands to `apply`, which copies them into the engine (the only receiver-side copy).

The views are valid until the sender writes the next version: the sender starts one only after
every receiver reported the previous one, so `apply` (which runs before that report) sees stable
bytes. Delta versions patch a mirror of the previous weights and therefore always go through
the `Reassembler`; a receiver that applied from views holds no mirror, so the next version it
gets is a full one. A version that outgrows the ring fails with a clear error (the slot it would
reuse still holds an earlier bucket of the same version); the receiver then copies again.
"""

from __future__ import annotations

import torch

from loongsage.transfer.bucketing import (
    ENCODING_DENSE,
    Arrivals,
    IncompleteVersion,
    dtype_from_name,
)
from loongsage.transfer.frames import BucketMeta


class ArenaAssembler:
    def __init__(self, arena: torch.Tensor, num_slots: int):
        self.arena, self.num_slots = arena, num_slots
        self.reset()

    def reset(self) -> None:
        self.starts: dict[str, tuple[int, str, tuple[int, ...], int]] = {}
        self.received: dict[str, int] = {}
        self.arrivals = Arrivals()

    def write(self, meta: BucketMeta, payload: torch.Tensor) -> None:
        if meta.index >= self.num_slots:
            raise IncompleteVersion(f"bucket {meta.index} reuses a slot of this version: the "
                                    f"version outgrew the {self.num_slots}-slot shared-memory "
                                    f"ring that zero-copy receive needs")
        self.arrivals.accept(meta, payload)
        base = payload.data_ptr() - self.arena.data_ptr()
        for spec in meta.specs:
            if spec.encoding != ENCODING_DENSE:
                raise IncompleteVersion(f"tensor {spec.name!r}: zero-copy receive takes dense "
                                        f"tensors only, got {spec.encoding!r}")
            where = base + spec.offset
            if spec.item_offset == 0:
                self.starts[spec.name] = (where, spec.dtype, spec.shape, spec.item_nbytes)
                self.received[spec.name] = 0
            start = self.starts.get(spec.name)
            if start is None or start[0] + spec.item_offset != where:
                raise IncompleteVersion(f"tensor {spec.name!r}: piece at byte {spec.item_offset} "
                                        f"is not contiguous with its start in the arena")
            self.received[spec.name] += spec.nbytes

    def finish(self, num_buckets: int, total_bytes: int) -> list[str]:
        self.arrivals.check_complete(num_buckets, total_bytes)
        short = [n for n, (_, _, _, size) in self.starts.items() if self.received[n] != size]
        if short:
            raise IncompleteVersion(f"tensors {short[:8]} arrived incomplete")
        return list(self.starts)

    def named_views(self) -> dict[str, torch.Tensor]:
        views = {}
        for name, (start, dtype, shape, nbytes) in self.starts.items():
            views[name] = self.arena[start:start + nbytes].view(dtype_from_name(dtype)).view(shape)
        return views
