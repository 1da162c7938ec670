"""A local Ray cluster's daemons in sessions of their own, and gone with the driver.

A terminal's Ctrl-C, ``timeout`` and a batch scheduler's time limit signal the driver's whole
process group. Ray starts its local daemons (GCS, raylet, log monitor, ...) from the driver,
so they were in that group and died of the signal before the driver could finish its step:
"Failed to connect to GCS within 60 seconds". ``daemons_in_own_sessions`` starts each of them
with ``setsid`` (Ray's own ``start_ray_process`` builds every daemon with the ``ConsolePopen``
class this swaps for the time of ``ray.init``; Ray already blocks SIGINT in them): a group
signal then reaches the driver only, and the driver's ``StopRequest`` decides.

Out of the driver's group they also lose the group's fate. Ray binds GCS and raylet to the
driver (``PR_SET_PDEATHSIG``), but not what the raylet starts: after a SIGKILL of the driver
its runtime-env and dashboard agents lived on for about a minute. ``start_reaper`` starts a
small process, in a session of its own too, holding the read end of a pipe whose write end
only the driver has: when the driver ends, however it ends, the reaper reads EOF and SIGKILLs
every process of the daemons' sessions (the raylet's workers and agents are in the raylet's),
looking again until none is left. It exits on its own once those sessions are empty (a normal
``ray.shutdown``). Linux does not hand out a session id again while a process of that
session lives, so the reaper never reaches beyond Ray's processes.

A run that ends normally stops its cluster with Ray's own ``ray.shutdown`` at exit, which
stops the daemons one after the other, each given up to 1 s to end on SIGTERM. Every one of
them ends within a few hundredths of a second but Ray's autoscaler monitor: it is stopped after
the GCS, and its SIGTERM handler first sends "the autoscaler failed" to that GCS, now gone, so
every run waited the full second before Ray sent it SIGKILL. ``end_monitor_first`` SIGKILLs
it just before Ray's shutdown: nothing of the run is lost with it (it holds no state of the
run, writes no file of it), and a SIGKILL runs no handler to report anything.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOOK_S = 1.0  # how often the reaper looks at its pipe and at the sessions
KILL_FOR_S = 8.0  # how long it keeps killing after the driver ended

_reapers: list[subprocess.Popen] = []  # their pipes stay open as long as this process lives


@contextmanager
def daemons_in_own_sessions() -> Iterator[list[int]]:
    """Within the block, every daemon Ray starts gets a session of its own; yields their pids."""
    from ray._private import services

    started: list[int] = []
    ray_popen = services.ConsolePopen

    class InOwnSession(ray_popen):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs) -> None:
            kwargs["start_new_session"] = True
            super().__init__(*args, **kwargs)
            started.append(self.pid)

    services.ConsolePopen = InOwnSession
    try:
        yield started
    finally:
        services.ConsolePopen = ray_popen


def start_reaper(sessions: list[int]) -> None:
    """Start the reaper of ``sessions`` (see the module docstring); Linux only."""
    if not sessions or not sys.platform.startswith("linux"):
        return
    _reapers.append(subprocess.Popen([sys.executable, str(Path(__file__)), *map(str, sessions)],
                                     stdin=subprocess.PIPE, start_new_session=True))


def end_monitor_first_at_exit() -> None:
    """Have ``end_monitor_first`` run at exit before Ray's own ``ray.shutdown`` (atexit runs the
    last registered first; Ray registers its hook when imported); once, however many runs start."""
    atexit.unregister(end_monitor_first)
    atexit.register(end_monitor_first)


def end_monitor_first() -> None:
    """SIGKILL the autoscaler monitor of the cluster this process started, if any (see the module docstring).

    Private Ray API, the only way to reach that process: the node this driver started
    (``ray._private.worker._global_node``) and its ``_kill_process_type``, which also reaps the
    process and leaves ``ray.shutdown`` nothing to wait for (ray 2.60.0, ray/_private/node.py:
    ``kill_all_processes`` stops the monitor after the GCS, with ``allow_graceful=True``)."""
    from ray._private import ray_constants, worker

    node = worker._global_node
    if node is not None and ray_constants.PROCESS_TYPE_MONITOR in node.all_processes:
        node._kill_process_type(ray_constants.PROCESS_TYPE_MONITOR, allow_graceful=False, check_alive=False)


def session_members(sessions: set[int]) -> list[int]:
    """Live (not zombie) processes whose session is one of ``sessions`` (field 6 of /proc/PID/stat)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) in sessions and fields[0] not in "ZX":
            members.append(int(entry))
    return members


def processes_marked(name: str, value: str) -> list[int]:
    """Live (not zombie) processes whose environment holds ``name=value``: every process a run
    starts inherits its environment, so a marker set on the command finds all of them, Ray's
    daemons and workers included (the tests and ``benchmarks/run_exit.py`` check none is left)."""
    needle = f"{name}={value}".encode()
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read().split(b"\0")
        except OSError:
            continue
        if needle in environ and state not in "ZX":
            alive.append(int(entry))
    return alive


def reap(sessions: set[int]) -> None:
    """Wait for EOF on stdin (the driver ended), then SIGKILL every member of ``sessions``."""
    while session_members(sessions):
        if select.select([sys.stdin], [], [], LOOK_S)[0] and not os.read(sys.stdin.fileno(), 4096):
            break
    else:
        return
    deadline = time.monotonic() + KILL_FOR_S
    while (members := session_members(sessions)) and time.monotonic() < deadline:
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


if __name__ == "__main__":
    reap({int(sid) for sid in sys.argv[1:]})
