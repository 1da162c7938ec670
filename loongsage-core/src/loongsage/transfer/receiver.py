"""WeightReceiver: the engine side of TransferMesh.

    receiver = WeightReceiver([mesh_address], apply=engine.apply_weights).start()

It connects to every sender rank, reports where it runs, attaches the transport the sender
picked, and reassembles each version into persistent staging tensors. `apply(named_tensors,
version)` is called once per version, from a receiver thread, only after every shard from
every sender verified; a version that fails anywhere (sender died, checksum, missing bucket,
delta against the wrong base) is never applied: the engine stays on its previous version and
`last_error` names the version and bucket. The tensors passed to `apply` are the receiver's
staging buffers, reused by the next version: an engine copies them into its parameters (as
`load_state_dict` / SGLang's `load_weights` do) and must not keep references.

`zero_copy=True` (same-host shared-memory senders only): once a full version is known to fit
in the sender's ring (from an earlier version, or from the size the sender announced in
`Begin`), full versions are not copied into staging; `apply` gets views of
the shared segment (`views.py`), so the receiver makes no copy of its own before the engine's.
A first version of unannounced size, delta versions and versions that outgrow the ring are
copied as above.
Staging is freed as soon as it is of no further use: after a version arrived as views, and
right after applying a copied full version that fitted every sender's ring (the next full
version comes as views, so nothing would read the copy again). Keeping it had cost a second
model-sized copy in every engine, 538 MB for SmolLM2, from the first sync until the second.
Such a receiver then reports no mirror, so senders send it full versions, never deltas: a
delta would have saved a same-host receiver nothing (the engine copies every tensor anyway)
and needed the model-sized mirror. Staging is kept where a sender's ring is too small for a
version, or without `zero_copy`: there it is reused by the next version and patched by deltas.

`bind` (with `zero_copy`; colocated runs only): a version that arrived whole as views goes to
`bind(named_views, version)` instead of `apply`, and the engine keeps the views as its weights
(`EmbeddedRolloutEngine.bind_weights`): one copy of the weights per host, the sender's ring.
The sender then overwrites the engine's weights as it writes the next version, which is safe
only while the engine generates nothing (colocated runs pause it for the sync). A version that
fails after that can have overwritten part of them: the previous version is gone, so the
receiver calls `lost(reason)` (the engine refuses requests until a version is applied) and the
error says so.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from multiprocessing.connection import Client, Connection

import torch

from loongsage.transfer.bucketing import ALIGN, IncompleteVersion, Reassembler
from loongsage.transfer.channels import ReceiverChannel
from loongsage.transfer.frames import (
    FRAME_ABORT,
    FRAME_BUCKET,
    Begin,
    Hello,
    MeshAddress,
    ReceiverInfo,
    Result,
    Welcome,
    WeightSyncError,
)
from loongsage.transfer.peer import no_delay
from loongsage.transfer.transports import TRANSPORTS
from loongsage.transfer.views import ArenaAssembler

ApplyFn = Callable[[Iterable[tuple[str, torch.Tensor]], int], None]


class _Pending:
    def __init__(self) -> None:
        self.names: set[str] = set()
        self.errors: list[str] = []
        self.views: dict[str, torch.Tensor] = {}
        self.done: set[int] = set()
        self.mirror_needed = False  # a sender's next full version would be copied again
        self.finished = False
        self.ok = False


class WeightReceiver:
    def __init__(self, senders: Sequence[MeshAddress], apply: ApplyFn, *,
                 receiver_id: str | None = None, host_id: str | None = None,
                 device: str = "cpu", address: str = "127.0.0.1", timeout_s: float = 60.0,
                 zero_copy: bool = False, bind: ApplyFn | None = None,
                 lost: Callable[[str], None] | None = None):
        if not senders:
            raise ValueError("WeightReceiver.senders: expected at least one MeshAddress")
        self.senders = list(senders)
        self.apply = apply
        self.info = ReceiverInfo(receiver_id or f"receiver-{uuid.uuid4().hex[:8]}",
                                 host_id or socket.gethostname(), device, address)
        self.timeout_s = timeout_s
        self.zero_copy = zero_copy
        self.bind, self.lost = bind, lost
        self.bound = False  # the engine's weights are views of a sender's ring
        self.zero_copy_versions = 0
        self.staging: dict[str, torch.Tensor] = {}
        self.applied_version: int | None = None
        self.mirror_version: int | None = None
        self.last_error = ""
        self.transports: dict[int, str] = {}
        self._pending: dict[int, _Pending] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._conns: list[Connection] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> WeightReceiver:
        for address in self.senders:
            conn = no_delay(Client((address.host, address.port), authkey=address.authkey))
            conn.send(Hello(self.info, self.applied_version, self.mirror_version))
            if not conn.poll(self.timeout_s):
                raise TimeoutError(f"sender rank {address.sender_rank} sent no Welcome")
            welcome = conn.recv()
            if not isinstance(welcome, Welcome):
                raise RuntimeError(f"expected Welcome, got {type(welcome).__name__}")
            channel = TRANSPORTS[welcome.transport].receiver(welcome.setup, conn,
                                                            self.info.device, self.timeout_s)
            self.transports[address.sender_rank] = welcome.transport
            self._conns.append(conn)
            thread = threading.Thread(target=self._serve, args=(address.sender_rank, conn,
                                                                channel),
                                      daemon=True, name=f"transfer-recv-{address.sender_rank}")
            self._threads.append(thread)
            thread.start()
        return self

    def wait_for_version(self, version: int, timeout_s: float | None = None) -> bool:
        """True once `version` (or a later one) is applied, False on timeout."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        with self._cond:
            while self.applied_version is None or self.applied_version < version:
                if not self._cond.wait(timeout=max(0.0, deadline - time.monotonic())):
                    return False
            return True

    def _serve(self, rank: int, conn: Connection, channel: ReceiverChannel) -> None:
        copier = Reassembler(self.staging, self.info.device)
        arena = getattr(channel, "arena", None)
        viewer = None
        if self.zero_copy and arena is not None and channel.setup["slot_bytes"] % ALIGN == 0:
            viewer = ArenaAssembler(arena, channel.setup["num_slots"])
        fits = False  # whether the last full version fitted in the ring
        ring = viewer.num_slots if viewer is not None else 0
        while not self._closed:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return
            if channel.on_control(message):
                continue
            if isinstance(message, Begin):
                full = message.base_version is None
                announced = message.padded_bytes is not None and viewer is not None and \
                    message.padded_bytes <= viewer.num_slots * channel.setup["slot_bytes"]
                assembler = viewer if viewer is not None and (fits or announced) and full \
                    else copier
                alive, fitted = self._receive(rank, conn, channel, assembler, message, ring)
                if not alive:
                    return
                if fitted is not None:
                    fits = fitted

    def _receive(self, rank: int, conn: Connection, channel: ReceiverChannel,
                 assembler: Reassembler | ArenaAssembler, begin: Begin,
                 ring_slots: int) -> tuple[bool, bool | None]:
        """One version's frames from one sender: (sender still alive, whether this full version
        fitted in a ring of `ring_slots` slots; None for a delta or an unannounced size)."""
        version, error, bucket, alive, names = begin.version, "", None, True, []
        num_buckets = None
        if begin.base_version is not None and begin.base_version != self.mirror_version:
            error = (f"delta against version {begin.base_version}, but this receiver holds "
                     f"{self.mirror_version}")
        assembler.reset()
        try:
            while True:
                meta, payload = channel.recv_frame()
                if meta.kind == FRAME_BUCKET:
                    bucket = meta.index
                    if not error:
                        try:
                            assembler.write(meta, payload)
                        except IncompleteVersion as exc:
                            error = str(WeightSyncError(version, meta.index, str(exc)))
                    channel.release(meta)
                elif meta.kind == FRAME_ABORT:
                    error = str(WeightSyncError(version, meta.index, f"sender rank {rank} "
                                                f"aborted: {meta.reason}"))
                    break
                else:
                    num_buckets = meta.num_buckets
                    if not error:
                        names = assembler.finish(meta.num_buckets, meta.total_bytes)
                    break
        except IncompleteVersion as exc:
            error = str(WeightSyncError(version, None, str(exc)))
        except (EOFError, OSError, RuntimeError, TimeoutError) as exc:
            alive = False
            error = str(WeightSyncError(version, bucket, f"lost sender rank {rank} after "
                                        f"{'no bucket' if bucket is None else 'this bucket'}: "
                                        f"{type(exc).__name__}: {exc}"))
        fitted = None
        if begin.base_version is None and num_buckets is not None:
            fitted = 0 < ring_slots and num_buckets <= ring_slots
        views = assembler.named_views() if isinstance(assembler, ArenaAssembler) and names else {}
        pending = self._shard_done(version, rank, names, error, views, fitted is not True)
        self._wait(pending, version)
        if alive:
            try:
                conn.send(Result(version, pending.ok, self.applied_version, self.mirror_version,
                                 "; ".join(pending.errors)))
            except (OSError, EOFError):
                return False, fitted
        return alive, fitted

    def _shard_done(self, version: int, rank: int, names: list[str], error: str,
                    views: dict[str, torch.Tensor], mirror_needed: bool) -> _Pending:
        with self._cond:
            pending = self._pending.setdefault(version, _Pending())
            pending.names.update(names)
            pending.views.update(views)
            pending.mirror_needed |= mirror_needed
            if error:
                pending.errors.append(error)
            pending.done.add(rank)
            if len(pending.done) < len(self.senders) or pending.finished:
                return pending
            self._pending.pop(version)
        self._finish(version, pending)
        return pending

    def _finish(self, version: int, pending: _Pending) -> None:
        error = "; ".join(pending.errors)
        bind = self.bind is not None and bool(pending.names) and set(pending.views) == pending.names
        if not error:
            try:
                (self.bind if bind else self.apply)(
                    [(name, pending.views[name] if name in pending.views else self.staging[name])
                     for name in sorted(pending.names)], version)
                self.bound = self.bound or bind
            except Exception as exc:  # the engine refused: stay on the old version
                error = str(WeightSyncError(version, None,
                                            f"apply failed: {type(exc).__name__}: {exc}"))
                pending.errors.append(error)
        if error:
            error = self._lose_bound(version, pending.errors)
        with self._cond:
            pending.ok = not error
            if pending.ok:
                self.applied_version = version
                self.zero_copy_versions += bool(pending.views)
                # staging mirrors the weights only if every tensor went through it, and is
                # worth keeping only if some sender's next full version is copied into it
                if pending.views or not pending.mirror_needed:
                    self.staging.clear()
                    self.mirror_version = None
                else:
                    self.mirror_version = version
            else:
                self.mirror_version = None
                self.last_error = error
            pending.finished = True
            self._cond.notify_all()

    def _wait(self, pending: _Pending, version: int) -> None:
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while not pending.finished:
                if not self._cond.wait(timeout=max(0.0, deadline - time.monotonic())):
                    pending.errors.append(f"weight version {version}: other sender ranks "
                                          f"never finished")
                    self.mirror_version = None
                    self.last_error = self._lose_bound(version, pending.errors)
                    pending.finished = True

    def _lose_bound(self, version: int, errors: list[str]) -> str:
        """After a failed version: if the engine's weights are ring views, some may have been
        overwritten, so tell the engine (``lost``) and say so in the error; returns the error."""
        if self.bound and self.lost is not None:
            errors.append(f"the engine's weights are views of the sender's ring and version "
                          f"{version} may have overwritten part of them: it refuses requests "
                          f"until a version is applied")
            try:
                self.lost("; ".join(errors))
            except Exception as exc:  # a stopped engine serves nothing anyway
                errors.append(f"telling the engine failed: {type(exc).__name__}: {exc}")
        return "; ".join(errors)

    def close(self) -> None:
        self._closed = True
        for conn in self._conns:
            try:
                conn.close()
            except OSError:
                pass
