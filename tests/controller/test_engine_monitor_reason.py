"""How ``EngineMonitor`` names a rollout engine that died while its ``/health`` probe was in
flight: by its process state read after the probe ("its process is gone"), not by the probe's
failure. A SIGKILL that lands between the monitor's first look at ``/proc`` and the probe used to
be reported as "/health did not answer 1 times in a row", as if the engine were hung; and a
process whose SIGKILL has landed but whose memory the kernel is still freeing reads as gone too.

The engine is a real child process killed for real; the pool around it is a stand-in that
records what the monitor marks (no Ray, no HTTP engine: only the naming is under test)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from types import SimpleNamespace

from loongsage.controller.engine_health import EngineMonitor, process_state


HOLDS_512_MB = ("import time; b = bytearray(1 << 29); b[::4096] = b'x' * (len(b) // 4096); "
                "print('ready', flush=True); time.sleep(60)")


def holding_memory() -> subprocess.Popen:
    """A child that touched 512 MB: the kernel takes milliseconds to tear it down after a SIGKILL."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDS_512_MB], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    return proc


class KilledDuringProbe:
    """A client whose ``/health`` probe sees its engine process die and reaped, then fails."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def health(self) -> bool:
        self.proc.kill()
        self.proc.wait()
        return False


class MarkingPool:
    def __init__(self, client: KilledDuringProbe) -> None:
        self.clients = [client]
        self.marked: list[tuple[str, int, str]] = []

    def __len__(self) -> int:
        return 1

    def mark_up(self, idx: int) -> None:
        self.marked.append(("up", idx, ""))

    def mark_down(self, idx: int, why: str) -> None:
        self.marked.append(("down", idx, why))


def monitor_of(proc: subprocess.Popen, pool: MarkingPool) -> EngineMonitor:
    monitor = EngineMonitor.__new__(EngineMonitor)
    monitor.run = SimpleNamespace(rollout_actors=[object()])
    monitor.pool, monitor.pids, monitor.misses, monitor.local = pool, [proc.pid], [0], True
    monitor.settings = SimpleNamespace(failures=3, max_restarts=0, interval_s=1.0)
    monitor.restarts, monitor._lock = 0, threading.RLock()
    return monitor


def test_an_engine_killed_during_its_health_probe_is_named_gone_not_unanswering():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert process_state(proc.pid) == "running"
    pool = MarkingPool(KilledDuringProbe(proc))

    stays_up = monitor_of(proc, pool).check(0)

    # out of restarts (max_restarts 0), so the replica stays down, named by its process state
    assert stays_up is False
    assert pool.marked == [("down", 0, "its process is gone")]


class KilledNotReaped(KilledDuringProbe):
    """As the fault tests do it: SIGKILL from outside and probe at once, nothing waited for."""

    def health(self) -> bool:
        os.kill(self.proc.pid, signal.SIGKILL)
        return False


def test_an_engine_still_being_torn_down_after_its_sigkill_is_named_gone():
    """The fault test's case (a full run named it "/health did not answer 1 times in a row"):
    the kill has landed but ``/proc`` still says ``R`` while the process's memory is freed."""
    proc = holding_memory()
    pool = MarkingPool(KilledNotReaped(proc))
    try:
        monitor_of(proc, pool).check(0, misses_allowed=1)
    finally:
        proc.wait()
    assert pool.marked == [("down", 0, "its process is gone")]


def test_process_state_reads_gone_from_the_moment_a_sigkill_is_sent():
    proc = holding_memory()
    assert process_state(proc.pid) == "running"
    os.kill(proc.pid, signal.SIGKILL)
    seen = [process_state(proc.pid) for _ in range(50)]  # the kernel is still tearing it down
    proc.wait()
    assert set(seen) == {"gone"}
