"""Contract checks any sandbox backend must pass; third-party backends can run them too.

    from loongsage_sandbox.testing import check_sandbox_contract
    asyncio.run(check_sandbox_contract(MySandbox, {"my_option": 1}))

Each check raises ``AssertionError`` with what broke. The checks cover the interface
(``exec`` results, files API, reset, close, the closed state), not isolation: isolation is
backend-specific and tested by the escape suite.
"""

from __future__ import annotations

from typing import Any

from loongsage_sandbox.base import ExecResult, FileEntry, Sandbox
from loongsage_sandbox.errors import SandboxClosedError, SandboxError


async def check_sandbox_contract(cls: type, params: Any = None, *, untrusted: bool = True) -> None:
    """Start ``cls(params)`` and check the behaviour every backend promises."""
    assert issubclass(cls, Sandbox), f"{cls} must subclass loongsage_sandbox.base.Sandbox"
    sb = cls(params, files={"init.txt": "initial"}, untrusted=untrusted)
    async with sb:
        r = await sb.exec("printf out; printf err >&2; exit 3")
        assert isinstance(r, ExecResult), f"exec returned {type(r).__name__}, not ExecResult"
        assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, b"out", b"err", False), r
        r = await sb.exec(["cat"], stdin=b"\x00\x01binary")
        assert r.stdout == b"\x00\x01binary", "stdin must reach the command byte for byte"
        r = await sb.exec("sleep 30", timeout=0.5)
        assert r.timed_out and r.exit_code is None, f"a timeout must be reported and kill the command: {r}"
        await sb.write_file("d/x.bin", bytes(range(256)))
        assert await sb.read_file("d/x.bin") == bytes(range(256)), "read_file must return what write_file wrote"
        entries = await sb.list_files("d")
        assert entries == [FileEntry("x.bin", "file", 256)], entries
        for bad in ("../x", "/etc/passwd"):
            try:
                await sb.read_file(bad)
            except SandboxError as err:
                assert err.kind == "path_escape", f"{bad!r}: kind {err.kind!r}, expected 'path_escape'"
            else:
                raise AssertionError(f"read_file({bad!r}) must be refused")
        await sb.reset()
        names = sorted(e.name for e in await sb.list_files("."))
        assert names == ["init.txt"], f"reset must restore only the initial files, found {names}"
        assert await sb.read_file("init.txt") == b"initial"
    assert sb.closed
    try:
        await sb.exec("true")
    except SandboxClosedError:
        pass
    else:
        raise AssertionError("exec after close must raise SandboxClosedError")
    await sb.close()  # idempotent


_BWRAP_REASON: list[str | None] = []


def bwrap_unavailable_reason() -> str | None:
    """Why ``bwrap`` sandboxes cannot start here (binary missing, no user namespaces), or None."""
    if not _BWRAP_REASON:
        import asyncio
        import shutil

        if shutil.which("bwrap") is None:
            _BWRAP_REASON.append("bubblewrap not installed (apt-get install -y bubblewrap)")
        else:
            from loongsage_sandbox.bwrap import BwrapSandbox

            async def probe() -> None:
                async with BwrapSandbox(untrusted=False) as sb:
                    await sb.exec(["true"])

            import concurrent.futures

            with concurrent.futures.ThreadPoolExecutor(1) as pool:  # callable from inside a loop too
                try:
                    pool.submit(asyncio.run, probe()).result()
                    _BWRAP_REASON.append(None)
                except SandboxError as err:
                    _BWRAP_REASON.append(f"bubblewrap cannot create sandboxes here: {err}")
    return _BWRAP_REASON[0]


def host_processes_with(marker: str) -> list[int]:
    """PIDs of host processes whose command line contains ``marker`` (for leak checks)."""
    import os

    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if marker.encode() in f.read().replace(b"\0", b" "):
                        found.append(int(name))
            except OSError:
                pass
    return found


def supervisor_processes(ancestor: int) -> dict[int, list[int]]:
    """The host pids of the sandbox supervisors ``ancestor`` started (itself included), each
    with the pids of its live children, the commands it is running right now (fault tests
    kill a supervisor mid-exec with it)."""
    import os

    parents: dict[int, int] = {}
    commands: dict[int, list[bytes]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if fields[0] not in ("Z", "X"):
            parents[int(name)], commands[int(name)] = int(fields[1]), argv
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {}, [ancestor]
    while todo:
        pid = todo.pop()
        argv = commands.get(pid, [])
        if argv[1:3] == [b"-I", b"-S"] and len(argv) > 3 and argv[3].endswith(b"supervisor.py"):
            found[pid] = sorted(children.get(pid, []))
        todo += children.get(pid, [])
    return found
