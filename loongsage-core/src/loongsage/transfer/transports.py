"""The table of transports: name -> sender channel factory, receiver channel, availability.

`available()` returns None when the transport can run in this process, else the reason it
cannot (used by the benchmark to say what it skipped, and by tests to skip GPU paths).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from loongsage.transfer.channels import ReceiverChannel, SenderChannel
from loongsage.transfer.cuda_ipc import (
    CudaIpcReceiverChannel,
    CudaIpcSenderChannel,
    cuda_ipc_available,
)
from loongsage.transfer.frames import TransferConfig
from loongsage.transfer.procgroup import (
    BroadcastReceiverChannel,
    BroadcastSenderChannel,
    NcclReceiverChannel,
    NcclSenderChannel,
    nccl_available,
)
from loongsage.transfer.shm import ShmReceiverChannel, ShmRing, ShmSenderChannel


@dataclass
class SenderContext:
    config: TransferConfig
    slots: list[torch.Tensor]
    sender_rank: int
    device: str
    ring: ShmRing | None


@dataclass(frozen=True)
class Transport:
    name: str
    sender: Callable[[SenderContext], SenderChannel]
    receiver: type[ReceiverChannel]
    available: Callable[[], str | None]


def _always() -> str | None:
    return None


def _needs_cuda() -> str | None:
    return None if cuda_ipc_available() else "no CUDA device on this machine"


def _needs_nccl() -> str | None:
    return None if nccl_available() else "no CUDA device / NCCL in this torch build"


def _shm_sender(ctx: SenderContext) -> SenderChannel:
    ring = ctx.ring if ctx.ring is not None else ShmRing(ctx.config.num_slots,
                                                          ctx.config.bucket_bytes)
    ctx.ring = ring
    return ShmSenderChannel(ctx.config, ctx.slots, ctx.sender_rank, ring)


TRANSPORTS: dict[str, Transport] = {
    "shm": Transport("shm", _shm_sender, ShmReceiverChannel, _always),
    "gloo": Transport("gloo", lambda c: BroadcastSenderChannel(c.config, c.slots, c.sender_rank),
                      BroadcastReceiverChannel, _always),
    "cuda_ipc": Transport("cuda_ipc",
                          lambda c: CudaIpcSenderChannel(c.config, c.slots, c.sender_rank,
                                                         c.device),
                          CudaIpcReceiverChannel, _needs_cuda),
    "nccl": Transport("nccl", lambda c: NcclSenderChannel(c.config, c.slots, c.sender_rank),
                      NcclReceiverChannel, _needs_nccl),
}
