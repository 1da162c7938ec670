"""Host side of the in-sandbox supervisor: start it, send one request at a time, always clean up.

``SupervisedSandbox`` is the shared base of the ``process``, ``bwrap`` and ``docker`` backends;
each only says how to launch ``supervisor.py`` (``_launch_argv``) and where its work dir is. The
supervisor process is started in a new session so that closing the sandbox can kill its whole
process group; a reply that does not arrive within the exec timeout plus a grace period
means the supervisor is gone, and the sandbox is torn down and reported as crashed.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from loongsage_sandbox import leftovers
from loongsage_sandbox.base import ExecResult, FileEntry, Sandbox
from loongsage_sandbox.errors import SandboxCrashedError, SandboxError

SUPERVISOR_SOURCE = Path(__file__).with_name("supervisor.py")
GRACE_S = 10.0  # on top of an exec's own timeout before the supervisor counts as hung
_LIVE: "set[SupervisedSandbox]" = set()  # strong refs: an unclosed sandbox must still be found at exit


class SupervisedSandbox(Sandbox):
    """A sandbox whose commands run under ``supervisor.py`` inside some isolation boundary."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self.state: leftovers.StateDir | None = None
        self.supervisor_pid: int | None = None  # pid inside the sandbox (its own namespace)

    # -- what each backend provides ------------------------------------------------
    def _launch_argv(self, supervisor_config: dict[str, Any]) -> list[str]:
        raise NotImplementedError

    def _launch_kwargs(self) -> dict[str, Any]:
        return {}

    def _supervisor_config(self) -> dict[str, Any]:
        p = self.params
        return {
            "limits": p.rlimits(),
            "max_output_bytes": int(p.max_output_kb) << 10,
            "host_pidns": os.readlink("/proc/self/ns/pid"),
            # no .pyc files: an agent edits a module and runs it again within the second, and a
            # cached .pyc of the same source size and second would run the old code
            "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
                    "PYTHONDONTWRITEBYTECODE": "1",
                    leftovers.ENV_MARKER: self.state.id if self.state else "", **p.env},
        }

    def _launch_env(self) -> dict[str, str]:
        """Environment of the launched process; tagged so leftovers can be found after a crash."""
        return {**os.environ, leftovers.ENV_MARKER: self.state.id}

    async def _after_close(self) -> None:
        """Backend-specific teardown (containers); state dir removal happens after it."""

    # -- lifecycle ---------------------------------------------------------------
    async def _start(self) -> None:
        leftovers.cleanup_once()
        self.state = leftovers.StateDir.create(self.backend)
        argv = self._launch_argv(self._supervisor_config())
        env = self._launch_env()
        kwargs = self._launch_kwargs()
        self._proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True, env=env,
            limit=64 << 20, **kwargs)
        for fd in kwargs.get("pass_fds", ()):
            os.close(fd)
        _LIVE.add(self)
        hello = await self._read_reply(30.0, "starting")
        self.supervisor_pid = hello.get("pid")

    async def _close(self) -> None:
        """Ask the supervisor to shut down, then kill and reap it whatever happened; a close that
        is itself cancelled (an async run stopping with tool calls in flight) still kills the
        group and closes our pipe before the cancellation goes on, so nothing outlives the loop."""
        proc = self._proc
        try:
            if proc is not None and proc.returncode is None:
                try:
                    proc.stdin.write(b'{"op": "shutdown"}\n')
                    await proc.stdin.drain()
                    await asyncio.wait_for(proc.stdout.readline(), 2.0)
                except (ConnectionError, asyncio.TimeoutError, OSError):
                    pass
        finally:
            self._kill_group()
            self._close_stdin()
            try:
                if proc is not None:
                    await self._reap(proc)
                await self._after_close()
            finally:
                _LIVE.discard(self)
                if self.state is not None:
                    self.state.remove()

    def _abandon(self) -> None:
        """Synchronous teardown for a cancelled request: kill everything, drop the state."""
        self._state.closed = True
        _kill_everything([self])
        self._close_stdin()
        _LIVE.discard(self)
        if self.state is not None:
            self.state.remove()

    @staticmethod
    async def _reap(proc: Any) -> None:
        """Wait (briefly) for a killed supervisor to exit and its pipes to reach EOF."""
        try:
            await asyncio.wait_for(proc.wait(), 5.0)
        except asyncio.TimeoutError:
            pass

    def _close_stdin(self) -> None:
        """Close our end of the supervisor's stdin now, on the running loop (garbage
        collection would close it after the loop is gone, which asyncio reports as an error)."""
        if self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.close()

    def _kill_group(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    # -- protocol ------------------------------------------------------------------
    async def _request(self, payload: dict[str, Any], wait_s: float) -> dict[str, Any]:
        async with self._lock:
            self._check_open()
            proc = self._proc
            try:
                proc.stdin.write(json.dumps(payload).encode() + b"\n")
                await proc.stdin.drain()
            except (ConnectionError, OSError):
                await self._crashed("sending a request")
            try:
                reply = await self._read_reply(wait_s, payload.get("op", "?"))
            except asyncio.CancelledError:
                self._abandon()  # its reply would be read as the next one's: never reuse it
                await self._reap(proc)  # its pipes close on this loop, not in GC after it
                raise
        if not reply.get("ok"):
            raise SandboxError(f"{self.backend} sandbox: {reply.get('message')}", reply.get("error", "error"))
        return reply

    async def _read_reply(self, wait_s: float, what: str) -> dict[str, Any]:
        try:
            line = await asyncio.wait_for(self._proc.stdout.readline(), wait_s)
        except asyncio.TimeoutError:
            await self._crashed(f"{what} (no answer within {wait_s:.0f} s)")
        if not line:
            await self._crashed(what)
        try:
            return json.loads(line)
        except ValueError:
            await self._crashed(f"{what} (garbled answer)")

    async def _crashed(self, what: str) -> None:
        stderr = b""
        _kill_everything([self])  # the supervisor cannot clean up after its children now
        if self._proc is not None:
            try:
                stderr = await asyncio.wait_for(self._proc.stderr.read(4096), 1.0)
            except (asyncio.TimeoutError, ValueError):
                pass
        await self.close()
        detail = stderr.decode(errors="replace").strip()
        raise SandboxCrashedError(
            f"{self.backend} sandbox supervisor died while {what}"
            + (f": {detail}" if detail else "") + "; the sandbox was closed")

    # -- primitives ------------------------------------------------------------------
    async def _exec(self, argv: list[str], stdin: bytes | None, timeout: float,
                    env: dict[str, str], cwd: str) -> ExecResult:
        reply = await self._request({
            "op": "exec", "argv": argv, "timeout": timeout, "env": env, "cwd": cwd,
            "stdin": base64.b64encode(stdin).decode() if stdin else None,
        }, timeout + GRACE_S)
        return ExecResult.from_wire(reply)

    async def _write(self, path: str, data: bytes, mode: int) -> None:
        await self._request({"op": "write", "path": path, "mode": mode,
                             "data": base64.b64encode(data).decode()}, 30.0)

    async def _read(self, path: str, max_bytes: int) -> bytes:
        reply = await self._request({"op": "read", "path": path, "max_bytes": max_bytes}, 30.0)
        return base64.b64decode(reply["data"])

    async def _list(self, path: str) -> list[FileEntry]:
        reply = await self._request({"op": "list", "path": path}, 30.0)
        return [FileEntry(**e) for e in reply["entries"]]

    async def _reset(self) -> None:
        await self._request({"op": "reset"}, 30.0)


@atexit.register
def _close_all_at_exit() -> None:
    """Kill supervisors and remove state of sandboxes nobody closed (no event loop needed)."""
    live = [sb for sb in _LIVE if sb.state is not None]
    _kill_everything(live)
    for sb in live:
        sb.state.remove()


def _kill_everything(sandboxes: list[SupervisedSandbox]) -> None:
    """Kill supervisors and every process tagged with their ids (children in their own sessions).

    Tagged processes are looked for again until none is left (a few rounds at most): a command
    that forks while the first round is being killed (``sh -c 'sleep 9'`` right after its exec,
    when the supervisor died mid-exec) would otherwise leave its child running."""
    for sb in sandboxes:
        sb._kill_group()
    ids = {sb.state.id for sb in sandboxes if sb.state is not None}
    for _ in range(5 if ids else 0):
        pids = leftovers.tagged_processes(ids)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)  # let the killed ones go before looking again
