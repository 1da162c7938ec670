"""Shared-memory transport for receivers on the sender's host (CPU).

The sender creates `num_slots` bucket-sized segments once, touches every page, and keeps them
for its lifetime: measured on a 2-core CPU machine, first-touch allocation of shared memory cost
~10x a copy, so a sync must only ever write into warm segments. Segments are anonymous files:
created in /dev/shm and unlinked at once, reachable by receivers through `/proc/<sender
pid>/fd/<fd>`, so nothing leaks in /dev/shm even if the sender is killed. The slots are consecutive
views of ONE segment (the arena), so a tensor split across buckets is contiguous in it. Copies per
same-host delivery:
  default        tensor -> slot (sender), slot -> receiver staging (receiver): two, pipelined
                 over the slots; then the engine's `apply` copies staging into its parameters.
  zero-copy      (`WeightReceiver(zero_copy=True)`, when one version fits in the ring, i.e.
                 num_slots * bucket_bytes >= version bytes): tensor -> slot (sender) only; the
                 receiver hands `apply` views of the arena (`views.py`), and the engine's own
                 copy into its parameters is the second and last.
"""

from __future__ import annotations

import os
import tempfile
from multiprocessing.connection import Connection

import torch

from loongsage.transfer.channels import SlotReceiverChannel, SlotSenderChannel
from loongsage.transfer.frames import TransferConfig
from loongsage.transfer.peer import Peer

_SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None
_PAGE = 4096


def _map(path: str, nbytes: int) -> torch.Tensor:
    return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)


def prefault(slot: torch.Tensor) -> None:
    """Touch one byte per page so later copies do not pay page faults."""
    slot[::_PAGE].sum()


class ShmRing:
    """`num_slots` warm shared slots of `slot_bytes` each, views of one segment owned here."""

    def __init__(self, num_slots: int, slot_bytes: int):
        self.slot_bytes, self.num_slots = slot_bytes, num_slots
        fd, path = tempfile.mkstemp(prefix="loongsage-transfer-", dir=_SHM_DIR)
        try:
            os.ftruncate(fd, slot_bytes * num_slots)
            self.arena = _map(f"/proc/self/fd/{fd}", slot_bytes * num_slots)
        finally:
            os.unlink(path)
        self.arena.zero_()
        self.fd: int | None = fd
        self.slots = list(self.arena.split(slot_bytes))

    def setup(self) -> dict:
        return {"pid": os.getpid(), "fd": self.fd, "slot_bytes": self.slot_bytes,
                "num_slots": self.num_slots}

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class ShmSenderChannel(SlotSenderChannel):
    transport = "shm"

    def __init__(self, config: TransferConfig, slots: list[torch.Tensor], sender_rank: int,
                 ring: ShmRing):
        super().__init__(config, slots, sender_rank)
        self.ring = ring

    def channel_slots(self) -> list[torch.Tensor]:
        return self.ring.slots

    def welcome(self, peer: Peer) -> dict:
        return self.ring.setup()


class ShmReceiverChannel(SlotReceiverChannel):
    def __init__(self, setup: dict, conn: Connection, device: str, config_timeout_s: float):
        super().__init__(setup, conn, device, config_timeout_s)
        size, count = setup["slot_bytes"], setup["num_slots"]
        self.arena = _map(f"/proc/{setup['pid']}/fd/{setup['fd']}", size * count)
        prefault(self.arena)
        self.slots = list(self.arena.split(size))
