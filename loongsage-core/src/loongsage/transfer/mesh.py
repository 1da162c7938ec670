"""TransferMesh, the sender side: one instance per trainer rank that holds weights to send.

    mesh = TransferMesh(TransferConfig(bucket_bytes=64 << 20), sender_rank=0).start()
    address = mesh.address            # hand to every receiver (picklable)
    report = mesh.sync(train_engine.named_tensors(), version=step)

Receivers connect whenever they like (late joiners included) and report `ReceiverInfo`; the
mesh picks each one's transport from the topology table and keeps one channel per transport.
A sync streams the named tensors once through the bucket packer into warm slots and hands every
bucket to every channel, then waits until each receiver reports the version applied or failed.
Several trainer ranks may each run a mesh and send their own shard; a receiver that is given
all their addresses applies a version only once every shard arrived.

A CPU sender whose ring holds a whole version may keep its tensors *in* the ring
(`place_in_ring`): each tensor becomes a view of the bytes a full sync writes it to, so a sync
copies nothing and only tells the receivers the version is there. The trainer's weights then
exist once on the host, shared by the trainer and every zero-copy engine bound to the ring; it
is for senders whose receivers read the ring only while the sender does not write it
(colocated runs, where engines are paused while the trainer trains and syncs).

Delta sync (`TransferConfig.delta`): only when every receiver holds the version in the shadow;
otherwise (a late joiner, a failed receiver) the whole sync is full, for everyone.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from multiprocessing.connection import Listener

import torch

from loongsage.transfer.bucketing import BucketPacker, aligned, ring_offsets
from loongsage.transfer.channels import SenderChannel
from loongsage.transfer.delta import DeltaShadow
from loongsage.transfer.frames import (
    FRAME_ABORT,
    FRAME_END,
    Begin,
    BucketMeta,
    Hello,
    MeshAddress,
    SyncReport,
    TransferConfig,
    Welcome,
    WeightSyncError,
)
from loongsage.transfer.peer import Peer, no_delay
from loongsage.transfer.shm import ShmRing
from loongsage.transfer.topology import SenderPlace, choose_transport
from loongsage.transfer.transports import TRANSPORTS, SenderContext


class TransferMesh:
    def __init__(self, config: TransferConfig | None = None, *, sender_rank: int = 0,
                 host_id: str | None = None, device: str = "cpu"):
        self.config = config or TransferConfig()
        self.sender_rank = sender_rank
        self.place = SenderPlace(host_id or socket.gethostname(), device)
        self.shadow = DeltaShadow()
        self.peers: dict[str, Peer] = {}
        self.channels: dict[str, SenderChannel] = {}
        self._lock = threading.Lock()
        self._joined = threading.Condition(self._lock)
        self._listener: Listener | None = None
        self._ctx: SenderContext | None = None
        self.address: MeshAddress | None = None
        self.last_join_error = ""
        self._placed: list[tuple[str, int]] | None = None

    def start(self) -> TransferMesh:
        cfg = self.config
        ring = None
        if self.place.device == "cpu":
            ring = ShmRing(cfg.num_slots, cfg.bucket_bytes)
            slots = ring.slots
        else:
            slots = [torch.empty(cfg.bucket_bytes, dtype=torch.uint8, device=self.place.device)
                     for _ in range(cfg.num_slots)]
        self._ctx = SenderContext(cfg, slots, self.sender_rank, self.place.device, ring)
        probe = MeshAddress(cfg.host, 0, self.sender_rank)
        self._listener = Listener((cfg.host, 0), authkey=probe.authkey)
        self.address = MeshAddress(cfg.host, self._listener.address[1], self.sender_rank,
                                   probe.authkey)
        threading.Thread(target=self._accept, daemon=True, name="transfer-accept").start()
        return self

    def __enter__(self) -> TransferMesh:
        return self.start() if self._listener is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while self._listener is not None:
            try:
                conn = no_delay(self._listener.accept())
            except (OSError, EOFError):
                if self._listener is None:
                    return
                continue
            try:
                if not conn.poll(self.config.timeout_s):
                    raise TimeoutError("receiver sent no Hello")
                hello = conn.recv()
                if not isinstance(hello, Hello):
                    raise TypeError(f"expected Hello, got {type(hello).__name__}")
                transport = choose_transport(self.place, hello.info)
                peer = Peer(hello.info, conn, transport, hello.applied_version,
                            hello.mirror_version)
                with self._lock:
                    channel = self._channel(transport)
                    conn.send(Welcome(transport, channel.welcome(peer)))
                    self.peers[peer.receiver_id] = peer
                    peer.start()
                    self._joined.notify_all()
            except (OSError, EOFError, TypeError, ValueError, TimeoutError) as exc:
                conn.close()
                with self._lock:
                    self.last_join_error = str(exc)

    def _channel(self, transport: str) -> SenderChannel:
        if transport not in self.channels:
            spec = TRANSPORTS[transport]
            reason = spec.available()
            if reason:
                raise ValueError(f"transport {transport!r} unavailable: {reason}")
            self.channels[transport] = spec.sender(self._ctx)
        return self.channels[transport]

    def wait_for_receivers(self, count: int, timeout_s: float | None = None) -> list[str]:
        """Block until `count` live receivers are connected; returns their ids."""
        deadline = time.monotonic() + (timeout_s or self.config.timeout_s)
        with self._joined:
            while sum(p.alive for p in self.peers.values()) < count:
                if not self._joined.wait(timeout=max(0.0, deadline - time.monotonic())):
                    raise TimeoutError(f"{count} receivers expected, "
                                       f"{len(self.peers)} connected")
            return [rid for rid, p in self.peers.items() if p.alive]

    def place_in_ring(self, named_tensors: Sequence[tuple[str, torch.Tensor]]
              ) -> list[tuple[str, torch.Tensor]]:
        """Copy each tensor to where a full sync of this same sequence writes it in the ring and
        return those places as views of its dtype and shape, in order.

        A sender that makes its tensors *be* these views (``param.data = view``) sends every
        later version without copying: the packer skips a piece already where it goes. From
        then on every sync must send the same names with the same sizes in the same order
        (``sync`` raises before writing anything out of place), and a receiver bound to the
        ring sees the sender's writes as they happen, so they must not read it meanwhile.
        Only a CPU ring that holds the whole sequence, without delta sync, has such places.
        """
        if self._ctx is None or self._ctx.ring is None:
            raise RuntimeError("TransferMesh.place_in_ring needs a started mesh on a CPU device")
        if self.config.delta:
            raise ValueError("TransferMesh.place_in_ring: delta sync sends patches, "
                             "not tensors in place")
        sizes = [t.numel() * t.element_size() for _, t in named_tensors]
        offsets = ring_offsets(sizes, self.config.bucket_bytes)
        arena = self._ctx.ring.arena
        if named_tensors and offsets[-1] + sizes[-1] > arena.numel():
            raise ValueError(f"TransferMesh.place_in_ring: the tensors take "
                             f"{offsets[-1] + sizes[-1]} bytes of ring, it has {arena.numel()} "
                             "(transfer.num_slots)")
        views = []
        for (name, tensor), offset, nbytes in zip(named_tensors, offsets, sizes):
            view = arena[offset:offset + nbytes].view(tensor.dtype).view(tensor.shape)
            view.copy_(tensor.detach())
            views.append((name, view))
        self._placed = [(name, nbytes) for (name, _), nbytes in zip(named_tensors, sizes)]
        return views

    def _in_placed_order(self, named_tensors: Iterable[tuple[str, torch.Tensor]]
                         ) -> Iterator[tuple[str, torch.Tensor]]:
        """``named_tensors``, checked one by one against what ``place_in_ring`` laid out."""
        placed = self._placed or []
        count = 0
        for count, (name, tensor) in enumerate(named_tensors, start=1):
            got = (name, tensor.numel() * tensor.element_size())
            if count > len(placed) or placed[count - 1] != got:
                expected = placed[count - 1] if count <= len(placed) else "nothing more"
                raise ValueError(f"tensor {count - 1} is {got}, the ring placed {expected}: "
                                 "a sender whose tensors live in its ring sends the same ones "
                                 "in the same order")
            yield name, tensor
        if count != len(placed):
            raise ValueError(f"{count} tensors sent, the ring placed {len(placed)}")

    def transports(self) -> dict[str, list[str]]:
        with self._lock:
            groups: dict[str, list[str]] = {}
            for peer in self.peers.values():
                if peer.alive:
                    groups.setdefault(peer.transport, []).append(peer.receiver_id)
            return groups

    def sync(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
             ) -> SyncReport:
        """Send one version to every connected receiver and wait until each applied it.

        Raises WeightSyncError (naming version and bucket) if producing or packing the tensors
        fails, once every receiver dropped the partial version (they stay on the previous one).
        Receivers that fail on their side are listed in `SyncReport.failed` and get a full
        version next time.
        """
        if self._ctx is None:
            raise RuntimeError("TransferMesh.sync called before start()")
        start = time.perf_counter()
        with self._lock:
            for rid in [rid for rid, p in self.peers.items() if not p.alive]:
                self.peers.pop(rid).close()
            peers = list(self.peers.values())
        groups: dict[str, list[Peer]] = {}
        for peer in peers:
            groups.setdefault(peer.transport, []).append(peer)
        if not peers:
            self.shadow.invalidate()
            return SyncReport(version, None, 0, 0, 0, time.perf_counter() - start, {}, [], {})
        base = self.shadow.version
        delta = self.config.delta and base is not None and all(
            p.mirror_version == base for p in peers)
        base = base if delta else None
        active = []
        for name, members in groups.items():
            try:
                self.channels[name].prepare(members)
                active.append(self.channels[name])
            except RuntimeError as exc:  # e.g. a gloo member never joined the new group
                for peer in members:
                    peer.mark_dead(f"{name} group setup failed: {exc}")
        padded = None
        if base is None and isinstance(named_tensors, Sequence):
            padded = sum(aligned(t.numel() * t.element_size()) for _, t in named_tensors)
        for peer in peers:
            peer.send(Begin(version, base, padded))
        deadline = time.monotonic() + self.config.timeout_s
        slots = self._ctx.slots

        def acquire(slot: int) -> torch.Tensor:
            for channel in active:
                channel.wait_slot(slot, time.monotonic() + self.config.timeout_s)
            return slots[slot]

        packer = BucketPacker(bucket_bytes=self.config.bucket_bytes,
                              num_slots=self.config.num_slots, acquire=acquire, version=version,
                              sender_rank=self.sender_rank, base_version=base,
                              checksum=self.config.checksum)
        if self._placed is not None:
            named_tensors = self._in_placed_order(named_tensors)
        items = self.shadow.items(named_tensors, delta=delta, keep=self.config.delta)
        try:
            for meta, payload in packer.pack(items):
                for channel in active:
                    channel.send(meta, payload)
        except Exception as exc:
            self.shadow.invalidate()
            abort = BucketMeta(FRAME_ABORT, version, self.sender_rank, packer.num_buckets,
                               reason=f"{type(exc).__name__}: {exc}")
            for channel in active:
                channel.send(abort, None)
            for peer in peers:  # raise only once every receiver dropped the version
                peer.wait_result(version, time.monotonic() + self.config.timeout_s)
            raise WeightSyncError(version, packer.num_buckets,
                                  f"sender rank {self.sender_rank} failed while packing: "
                                  f"{type(exc).__name__}: {exc}") from exc
        end = BucketMeta(FRAME_END, version, self.sender_rank, packer.num_buckets,
                         base_version=base, num_buckets=packer.num_buckets,
                         total_bytes=packer.payload_bytes)
        for channel in active:
            channel.send(end, None)
        applied, failed = [], {}
        for peer in peers:
            result = peer.wait_result(version, deadline)
            if result is not None and result.ok:
                applied.append(peer.receiver_id)
            else:
                failed[peer.receiver_id] = result.error if result is not None else peer.error
        self.shadow.version = version if self.config.delta else None
        return SyncReport(version, base, packer.num_buckets, packer.payload_bytes,
                          self.shadow.tensor_bytes, time.perf_counter() - start,
                          {name: [p.receiver_id for p in members]
                           for name, members in groups.items()}, applied, failed)

    def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            for peer in self.peers.values():
                peer.close()
            self.peers.clear()
            for channel in self.channels.values():
                channel.close()
            self.channels.clear()
        if self._ctx is not None and self._ctx.ring is not None:
            self._ctx.ring.close()
