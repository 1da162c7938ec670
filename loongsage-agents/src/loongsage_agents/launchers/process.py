"""Run one agent program: its own process group, no stdin, a wall-time limit, output captured.

The program is started in a new session (``start_new_session``), so everything it spawns
(Codex's native binary, shells, tool processes) shares its process group; on timeout or
cancellation the whole group gets SIGTERM, then SIGKILL after ``grace_s``. After a normal
exit, anything still alive in the group (daemons the program left behind) is killed too.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass
from typing import Mapping, Sequence


@dataclass
class ProcessResult:
    exit_code: int | None  # None: killed by the timeout
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


async def _kill_group(proc: asyncio.subprocess.Process, grace_s: float) -> None:
    if _signal_group(proc.pid, signal.SIGTERM):
        try:
            await asyncio.wait_for(proc.wait(), grace_s)
        except asyncio.TimeoutError:
            pass
    _signal_group(proc.pid, signal.SIGKILL)


async def run_process(argv: Sequence[str], env: Mapping[str, str], cwd: str, timeout_s: float,
                      grace_s: float = 2.0) -> ProcessResult:
    """Run ``argv`` to completion or until ``timeout_s``; never leaves a process behind."""
    if not argv:
        raise ValueError("agent command is empty: set agent.params.argv")
    start = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=dict(env), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    communicate = asyncio.ensure_future(proc.communicate())
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.shield(communicate), timeout_s)
    except asyncio.TimeoutError:
        timed_out = True
    except BaseException:
        await _kill_group(proc, grace_s)
        communicate.cancel()
        raise
    await _kill_group(proc, 0.0 if not timed_out else grace_s)
    out, err = await communicate
    return ProcessResult(exit_code=None if timed_out else proc.returncode,
                         stdout=out.decode("utf-8", "replace"), stderr=err.decode("utf-8", "replace"),
                         timed_out=timed_out, duration_s=time.monotonic() - start)
