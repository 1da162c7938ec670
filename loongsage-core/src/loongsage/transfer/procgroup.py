"""Process-group broadcast transports: gloo (CPU receivers on other hosts) and NCCL (GPUs).

Each channel owns its process group, built from its own TCPStore with a per-generation prefix
and constructed directly (`ProcessGroupGloo(store, rank, size, options)`), so it never touches
the trainer's default process group. The sender is rank 0; receivers are ranks 1..n in join
order. When membership changes (a late joiner, a receiver that died) the group is rebuilt at
the start of the next sync: every member receives a `GroupSetup` on its control socket and all
ranks construct the new group together.

Per bucket three broadcasts travel: a 2-int64 header (metadata length, payload length), the
pickled `BucketMeta`, and the payload bytes (straight from the bucket slot, no extra copy).
NCCL is the same code on CUDA tensors; it is a real path that needs GPUs and is skipped on
machines without them. (SGLang's own `/update_weights_from_distributed` protocol, which sends
metadata over HTTP instead, lives with the SGLang engine:
`engines/sglang/distributed_sender.py`.)
"""

from __future__ import annotations

import datetime
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

from loongsage.transfer.channels import (
    ReceiverChannel,
    SenderChannel,
    decode_meta,
    encode_meta,
)
from loongsage.transfer.frames import BucketMeta, GroupSetup, TransferConfig
from loongsage.transfer.peer import Peer


def _gloo_group(store: dist.Store, rank: int, world: int, timeout_s: float, host: str):
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = datetime.timedelta(seconds=timeout_s)
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    return dist.ProcessGroupGloo(store, rank, world, opts)


def _nccl_group(store: dist.Store, rank: int, world: int, timeout_s: float, host: str):
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = datetime.timedelta(seconds=timeout_s)
    return dist.ProcessGroupNCCL(store, rank, world, opts)


def nccl_available() -> bool:
    return torch.cuda.is_available() and dist.is_nccl_available()


def _broadcast_async(group, tensor: torch.Tensor):
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    return group.broadcast([tensor], opts)


def _broadcast(group, tensor: torch.Tensor) -> None:
    _broadcast_async(group, tensor).wait()


class BroadcastSenderChannel(SenderChannel):
    transport = "gloo"
    make_group = staticmethod(_gloo_group)

    def __init__(self, config: TransferConfig, slots: list[torch.Tensor], sender_rank: int):
        super().__init__(config, slots, sender_rank)
        self.store: dist.TCPStore | None = None
        self.group = None
        self.members: tuple[str, ...] = ()
        self.generation = 0
        self.broken = ""
        self.inflight: dict[int, list[tuple[object, torch.Tensor]]] = {}

    def device(self) -> torch.device:
        return torch.device("cpu")

    def welcome(self, peer: Peer) -> dict:
        return {"slot_bytes": self.config.bucket_bytes, "address": peer.info.address,
                "sender_rank": self.sender_rank}

    def prepare(self, peers: list[Peer]) -> None:
        super().prepare(peers)
        self.broken = ""
        ids = tuple(p.receiver_id for p in peers)
        if peers and (ids != self.members or self.group is None):
            self._rebuild(peers)

    def _rebuild(self, peers: list[Peer]) -> None:
        timeout = datetime.timedelta(seconds=self.config.timeout_s)
        if self.store is None:
            self.store = dist.TCPStore(self.config.host, 0, is_master=True,
                                       wait_for_workers=False, timeout=timeout)
        self.generation += 1
        world = len(peers) + 1
        for rank, peer in enumerate(peers, start=1):
            peer.send(GroupSetup(self.generation, self.config.host, self.store.port, rank, world))
        prefix = dist.PrefixStore(f"{self.transport}/{self.sender_rank}/{self.generation}",
                                  self.store)
        self.group = None
        self.group = self.make_group(prefix, 0, world, self.config.timeout_s, self.config.host)
        self.members = tuple(p.receiver_id for p in peers)

    def wait_slot(self, slot: int, deadline: float) -> None:
        self._wait(self.inflight.pop(slot, []))

    def _wait(self, works: list[tuple[object, torch.Tensor]]) -> None:
        for work, _keepalive in works:
            if self.broken:
                return
            try:
                work.wait()
            except RuntimeError as exc:
                self._break(exc)

    def _break(self, exc: Exception) -> None:
        self.broken = f"{self.transport} broadcast failed: {exc}"
        self.group = None
        self.inflight.clear()

    def send(self, meta: BucketMeta, payload: torch.Tensor | None) -> None:
        """Issue the three broadcasts without waiting: the packer fills the next slot while
        this bucket is on the wire; `wait_slot` completes them before the slot is reused,
        and end/abort frames (no payload) drain everything."""
        if not self.peers or self.broken:
            return
        device = self.device()
        data = encode_meta(meta)
        nbytes = meta.nbytes if payload is not None else 0
        tensors = [torch.tensor([len(data), nbytes], dtype=torch.int64, device=device),
                   torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)]
        if nbytes:
            tensors.append(payload[:nbytes].to(device))
        try:
            works = [(_broadcast_async(self.group, t), t) for t in tensors]
        except RuntimeError as exc:
            self._break(exc)
            return
        self.inflight.setdefault(meta.slot, []).extend(works)
        if payload is None:
            for slot in list(self.inflight):
                self._wait(self.inflight.pop(slot, []))

    def close(self) -> None:
        self.group = None
        self.store = None


class NcclSenderChannel(BroadcastSenderChannel):
    transport = "nccl"
    make_group = staticmethod(_nccl_group)

    def device(self) -> torch.device:
        slot = self.slots[0] if self.slots else None
        return slot.device if slot is not None and slot.is_cuda else torch.device("cuda")


class BroadcastReceiverChannel(ReceiverChannel):
    make_group = staticmethod(_gloo_group)
    transport = "gloo"

    def __init__(self, setup: dict, conn: Connection, device: str, config_timeout_s: float):
        super().__init__(setup, conn, device, config_timeout_s)
        self.group = None
        self.buffer = torch.empty(setup["slot_bytes"], dtype=torch.uint8, device=self.wire_device())

    def wire_device(self) -> torch.device:
        return torch.device("cpu")

    def on_control(self, message: object) -> bool:
        if not isinstance(message, GroupSetup):
            return False
        timeout = datetime.timedelta(seconds=self.timeout_s)
        store = dist.TCPStore(message.host, message.port, is_master=False, timeout=timeout)
        prefix = dist.PrefixStore(f"{self.transport}/{self.setup['sender_rank']}/"
                                  f"{message.generation}", store)
        self.group = None
        self.group = self.make_group(prefix, message.rank, message.world_size, self.timeout_s,
                                     self.setup["address"])
        return True

    def recv_frame(self) -> tuple[BucketMeta, torch.Tensor | None]:
        if self.group is None:
            raise RuntimeError(f"{self.transport} frame expected before any GroupSetup")
        device = self.wire_device()
        header = torch.zeros(2, dtype=torch.int64, device=device)
        _broadcast(self.group, header)
        meta_len, nbytes = (int(v) for v in header.tolist())
        data = torch.empty(meta_len, dtype=torch.uint8, device=device)
        _broadcast(self.group, data)
        meta = decode_meta(data.cpu().numpy().tobytes())
        if not nbytes:
            return meta, None
        _broadcast(self.group, self.buffer[:nbytes])
        return meta, self.buffer


class NcclReceiverChannel(BroadcastReceiverChannel):
    make_group = staticmethod(_nccl_group)
    transport = "nccl"

    def wire_device(self) -> torch.device:
        return torch.device(self.device)
