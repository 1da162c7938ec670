"""Transport channels: the per-transport halves of moving a stream of frames.

A sender channel serves the receivers a mesh assigned to its transport: `welcome` gives a new
receiver what it needs to attach, `prepare` fixes the members of one sync, `wait_slot` blocks
until every member released a bucket slot, `send` delivers one frame (with its payload).
A receiver channel is built from the welcome's `setup` and yields `(meta, payload)` frames.

Two families share most code. Slot channels (shm, cuda_ipc) hand receivers memory they map once
(warm, reused every sync) and send only metadata frames over the control socket, then wait for
an `Ack` per slot. Broadcast channels (gloo, nccl) own a dedicated process group built from
their own TCPStore (independent of any default process group) and broadcast header, metadata
and payload. Concrete transports live in `shm.py`, `procgroup.py` and `cuda_ipc.py`; the table
at the bottom of `transports.py` maps names to them.
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from multiprocessing.connection import Connection

import torch

from loongsage.transfer.frames import Ack, BucketMeta, Frame, TransferConfig
from loongsage.transfer.peer import Peer


class SenderChannel(ABC):
    transport: str = ""

    def __init__(self, config: TransferConfig, slots: list[torch.Tensor], sender_rank: int):
        self.config, self.slots, self.sender_rank = config, slots, sender_rank
        self.peers: list[Peer] = []

    def welcome(self, peer: Peer) -> dict:
        return {}

    def prepare(self, peers: list[Peer]) -> None:
        self.peers = peers

    def wait_slot(self, slot: int, deadline: float) -> None:
        """Block until every member released `slot` (broadcasts release on return)."""

    @abstractmethod
    def send(self, meta: BucketMeta, payload: torch.Tensor | None) -> None: ...

    def close(self) -> None:
        """Release transport resources."""


class SlotSenderChannel(SenderChannel):
    """Receivers map this channel's slots once; frames travel on the control socket."""

    def channel_slots(self) -> list[torch.Tensor]:
        return self.slots

    def wait_slot(self, slot: int, deadline: float) -> None:
        for peer in self.peers:
            peer.wait_slot(slot, deadline)

    def send(self, meta: BucketMeta, payload: torch.Tensor | None) -> None:
        if payload is not None:
            target = self.channel_slots()[meta.slot]
            if target.data_ptr() != payload.data_ptr():
                target[:meta.nbytes].copy_(payload[:meta.nbytes])
            self.publish(target)
        for peer in self.peers:
            if payload is not None:
                with peer.cond:
                    peer.pending_slots.add(meta.slot)
            peer.send(Frame(meta))

    def publish(self, slot: torch.Tensor) -> None:
        """Make slot writes visible to receivers before the frame announces them."""


class ReceiverChannel(ABC):
    """Receiver half; `conn` is the control socket to the sender."""

    def __init__(self, setup: dict, conn: Connection, device: str, config_timeout_s: float):
        self.setup, self.conn, self.device, self.timeout_s = setup, conn, device, config_timeout_s

    def on_control(self, message: object) -> bool:
        """Handle a transport-specific control message; False if it is not one."""
        return False

    @abstractmethod
    def recv_frame(self) -> tuple[BucketMeta, torch.Tensor | None]: ...

    def release(self, meta: BucketMeta) -> None:
        """Tell the sender the payload of `meta` has been consumed."""

    def close(self) -> None:
        """Unmap or destroy transport resources."""


class SlotReceiverChannel(ReceiverChannel):
    slots: list[torch.Tensor]

    def recv_frame(self) -> tuple[BucketMeta, torch.Tensor | None]:
        if not self.conn.poll(self.timeout_s):
            raise TimeoutError(f"no frame from the sender within {self.timeout_s} s")
        message = self.conn.recv()
        if not isinstance(message, Frame):
            raise RuntimeError(f"expected a Frame on the control socket, got "
                               f"{type(message).__name__}")
        meta = message.meta
        return meta, (self.slots[meta.slot] if meta.nbytes or meta.specs else None)

    def release(self, meta: BucketMeta) -> None:
        self.conn.send(Ack(meta.version, meta.slot))


def encode_meta(meta: BucketMeta) -> bytes:
    return pickle.dumps(meta, protocol=pickle.HIGHEST_PROTOCOL)


def decode_meta(data: bytes) -> BucketMeta:
    meta = pickle.loads(data)
    if not isinstance(meta, BucketMeta):
        raise RuntimeError(f"expected a BucketMeta frame, got {type(meta).__name__}")
    return meta
