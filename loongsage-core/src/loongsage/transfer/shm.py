"""Shared-memory transport for receivers on the sender's host (CPU).

The sender creates `num_slots` bucket-sized segments once, touches every page, and keeps them
for its lifetime: REFERENCE §6.8 measured first-touch allocation of shared memory at ~10x the
cost of a copy, so a sync must only ever write into warm segments. Segments are anonymous
files: created in /dev/shm and unlinked at once, reachable by receivers through
`/proc/<sender pid>/fd/<fd>`, so nothing leaks in /dev/shm even if the sender is killed.
The packer writes buckets directly into these segments, so same-host delivery costs one copy on
each side (tensor -> segment -> receiver staging), pipelined over the slots.
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
    """`num_slots` warm shared segments of `slot_bytes` each, owned by this process."""

    def __init__(self, num_slots: int, slot_bytes: int):
        self.slot_bytes = slot_bytes
        self.fds: list[int] = []
        self.slots: list[torch.Tensor] = []
        for _ in range(num_slots):
            fd, path = tempfile.mkstemp(prefix="loongsage-transfer-", dir=_SHM_DIR)
            try:
                os.ftruncate(fd, slot_bytes)
                slot = _map(f"/proc/self/fd/{fd}", slot_bytes)
            finally:
                os.unlink(path)
            slot.zero_()
            self.fds.append(fd)
            self.slots.append(slot)

    def setup(self) -> dict:
        return {"pid": os.getpid(), "fds": list(self.fds), "slot_bytes": self.slot_bytes}

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


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
        pid, size = setup["pid"], setup["slot_bytes"]
        self.slots = [_map(f"/proc/{pid}/fd/{fd}", size) for fd in setup["fds"]]
        for slot in self.slots:
            prefault(slot)
