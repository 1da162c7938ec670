"""The sender's view of one connected receiver: its control socket, slot acks and results.

One reader thread per peer turns the receiver's messages into state the sync loop waits on:
`Ack`s free bucket slots, `Result`s close a version, and end-of-file marks the peer dead so a
vanished receiver never blocks the others.
"""

from __future__ import annotations

import socket
import threading
import time
from multiprocessing.connection import Connection

from loongsage.transfer.frames import Ack, ReceiverInfo, Result


def no_delay(conn: Connection) -> Connection:
    """Turn off Nagle's algorithm on a control connection (TCP).

    Control traffic is small messages sent back to back (a bucket frame, then the end frame);
    with Nagle on, the second waits for the receiver's delayed ACK, ~40 ms per sync on Linux,
    which dominated same-host syncs of small versions.
    """
    sock = socket.socket(fileno=conn.fileno())
    try:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    finally:
        sock.detach()
    return conn


class Peer:
    def __init__(self, info: ReceiverInfo, conn: Connection, transport: str,
                 applied_version: int | None, mirror_version: int | None):
        self.info, self.conn, self.transport = info, conn, transport
        self.applied_version, self.mirror_version = applied_version, mirror_version
        self.alive = True
        self.error = ""
        self.pending_slots: set[int] = set()
        self.results: dict[int, Result] = {}
        self.cond = threading.Condition()
        self._send_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name=f"transfer-peer-{info.receiver_id}")

    @property
    def receiver_id(self) -> str:
        return self.info.receiver_id

    def start(self) -> None:
        self._reader.start()

    def send(self, message: object) -> None:
        if not self.alive:
            return
        try:
            with self._send_lock:
                self.conn.send(message)
        except (OSError, EOFError, BrokenPipeError) as exc:
            self.mark_dead(f"control socket closed: {exc}")

    def mark_dead(self, error: str) -> None:
        with self.cond:
            if self.alive:
                self.alive, self.error = False, error
            self.cond.notify_all()

    def _read(self) -> None:
        while self.alive:
            try:
                message = self.conn.recv()
            except (OSError, EOFError) as exc:
                self.mark_dead(f"receiver disconnected ({type(exc).__name__})")
                return
            with self.cond:
                if isinstance(message, Ack):
                    self.pending_slots.discard(message.slot)
                elif isinstance(message, Result):
                    self.results[message.version] = message
                    self.applied_version = message.applied_version
                    self.mirror_version = message.mirror_version
                self.cond.notify_all()

    def wait_slot(self, slot: int, deadline: float) -> None:
        with self.cond:
            while self.alive and slot in self.pending_slots:
                if not self.cond.wait(timeout=max(0.0, deadline - time.monotonic())):
                    self.mark_dead(f"no ack for slot {slot} before the timeout")

    def wait_result(self, version: int, deadline: float) -> Result | None:
        with self.cond:
            while self.alive and version not in self.results:
                if not self.cond.wait(timeout=max(0.0, deadline - time.monotonic())):
                    self.mark_dead(f"no result for version {version} before the timeout")
            return self.results.pop(version, None)

    def close(self) -> None:
        self.alive = False
        try:
            self.conn.close()
        except OSError:
            pass
