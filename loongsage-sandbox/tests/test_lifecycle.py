"""Lifecycle and interface contract, run against every local backend that can run here."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from loongsage.plugin import ConfigError, UnknownPluginError
from loongsage.plugin.testing import installed_registries
from loongsage_sandbox.errors import (
    SandboxClosedError,
    SandboxCrashedError,
    SandboxError,
    SandboxUnavailableError,
    UntrustedCodeRefusedError,
)
from loongsage_sandbox.leftovers import state_root
from loongsage_sandbox.testing import bwrap_unavailable_reason, host_processes_with, supervisor_processes


BWRAP_REASON = bwrap_unavailable_reason()


def run(coro):
    return asyncio.run(coro)


def sandbox_class(name):
    return installed_registries().sandbox.get(name)


LOCAL = [pytest.param("bwrap", marks=pytest.mark.skipif(BWRAP_REASON is not None, reason=str(BWRAP_REASON))),
         "process"]


def make(backend, params=None, **kwargs):
    params = dict(params or {})
    if backend == "process":
        params["allow_untrusted_code"] = True
    return sandbox_class(backend)(params, **kwargs)


@pytest.mark.parametrize("backend", LOCAL)
def test_exec_reports_status_output_and_flags(backend):
    async def go():
        async with make(backend, {"max_output_kb": 4, "env": {"GREETING": "hi"}}) as sb:
            plain = await sb.exec("echo out; echo err >&2; exit 7")
            stdin = await sb.exec(["python3", "-c", "import sys; print(sys.stdin.read()[::-1])"], stdin="abc")
            big = await sb.exec("head -c 100000 /dev/zero | tr '\\0' x; head -c 9000 /dev/zero >&2")
            env = await sb.exec("echo $GREETING $EXTRA", env={"EXTRA": "there"})
            await sb.write_file("sub/dir/x.txt", "in sub\n")
            cwd = await sb.exec("cat x.txt; pwd", cwd="sub/dir")
            with pytest.raises(SandboxError) as missing:
                await sb.exec(["/no/such/binary"])
            return plain, stdin, big, env, cwd, missing.value

    plain, stdin, big, env, cwd, missing = run(go())
    assert (plain.exit_code, plain.stdout, plain.stderr, plain.ok) == (7, b"out\n", b"err\n", False)
    assert stdin.stdout == b"cba\n" and stdin.ok
    assert len(big.stdout) == 4096 and big.stdout_truncated and set(big.stdout) == {ord("x")}
    assert len(big.stderr) == 4096 and big.stderr_truncated
    assert env.text == "hi there\n"
    assert cwd.text.splitlines()[0] == "in sub" and cwd.text.splitlines()[1].endswith("/sub/dir")
    assert missing.kind == "not_found" and "/no/such/binary" in str(missing)


@pytest.mark.parametrize("backend", LOCAL)
def test_a_module_edited_within_the_second_runs_its_new_code(backend):
    """An agent's edit-and-rerun: the same size, the same mtime second. With a cached .pyc
    Python would validate it by that size and second and run the old code; sandboxes write
    none (PYTHONDONTWRITEBYTECODE), unless a data source's env says otherwise."""
    script = ("import os, subprocess, sys\n"
              "def run():\n"
              "    return subprocess.run([sys.executable, '-c', 'import m; print(m.X)'],"
              " capture_output=True, text=True).stdout.strip()\n"
              "open('m.py', 'w').write('X = 1\\n'); os.utime('m.py', (1e9, 1e9)); first = run()\n"
              "open('m.py', 'w').write('X = 2\\n'); os.utime('m.py', (1e9, 1e9)); print(first, run())\n")

    async def go():
        async with make(backend) as sb:
            fresh = await sb.exec(["python3", "-c", script])
        async with make(backend, {"env": {"PYTHONDONTWRITEBYTECODE": ""}}) as sb:
            cached = await sb.exec(["python3", "-c", script])
        return fresh, cached

    fresh, cached = run(go())
    assert fresh.text.split() == ["1", "2"], fresh
    assert cached.text.split() == ["1", "1"], cached  # the trap itself, with bytecode written


@pytest.mark.parametrize("backend", LOCAL)
def test_files_reset_and_close(backend):
    async def go():
        sb = make(backend, files={"main.py": "print(40 + 2)", "data/in.txt": b"\x00\x01"})
        async with sb:
            first = await sb.exec("python3 main.py")
            await sb.write_file("out/result.bin", bytes(range(256)))
            roundtrip = await sb.read_file("out/result.bin")
            listing = await sb.list_files("out")
            await sb.exec("echo changed > main.py; touch junk; sleep 4321 >/dev/null 2>&1 &")
            alive_before = len(host_processes_with("sleep 4321"))
            await sb.reset()
            alive_after = len(host_processes_with("sleep 4321"))
            after = await sb.exec("python3 main.py; ls; ls out 2>&1 | head -1")
            data = await sb.read_file("data/in.txt")
        with pytest.raises(SandboxClosedError):
            await sb.exec("true")
        await sb.close()  # idempotent
        with pytest.raises(SandboxClosedError):
            await sb.start()
        return first, roundtrip, listing, after, data, sb, (alive_before, alive_after)

    first, roundtrip, listing, after, data, sb, alive = run(go())
    assert first.text == "42\n"
    assert roundtrip == bytes(range(256))
    assert [(e.name, e.type, e.size) for e in listing] == [("result.bin", "file", 256)]
    lines = after.text.splitlines()
    assert lines[0] == "42"  # initial file restored
    assert lines[1:3] == ["data", "main.py"]  # junk and out/ gone
    assert alive == (1, 0)  # the background sleeper survived its exec and was killed by reset
    assert data == b"\x00\x01"
    assert not (state_root() / sb.state.id).exists()


@pytest.mark.parametrize("backend", LOCAL)
def test_context_manager_closes_on_error_and_kills_everything(backend):
    box = {}

    async def go():
        async with make(backend) as sb:
            box["sb"] = sb
            await sb.exec("sleep 321 >/dev/null 2>&1 &")
            raise RuntimeError("agent bug")

    with pytest.raises(RuntimeError, match="agent bug"):
        run(go())
    sb = box["sb"]
    assert sb.closed and not (state_root() / sb.state.id).exists()
    from loongsage_sandbox.leftovers import tagged_processes

    assert tagged_processes({sb.state.id}) == []


@pytest.mark.parametrize("backend", LOCAL)
def test_a_dead_supervisor_is_reported_and_cleaned_up(backend):
    async def go():
        async with make(backend) as sb:
            os.killpg(sb._proc.pid, signal.SIGKILL)
            with pytest.raises(SandboxCrashedError, match="supervisor died"):
                await sb.exec("echo hi")
            assert sb.closed
            return sb

    sb = run(go())
    assert not (state_root() / sb.state.id).exists()


@pytest.mark.parametrize("backend", LOCAL)
def test_a_supervisor_killed_mid_exec_fails_that_exec_at_once_and_leaves_nothing(backend):
    """SIGKILL of the supervisor alone (not its process group) while it runs a command: the exec
    fails as crashed as soon as the supervisor's pipe closes (not after the command's timeout
    plus the grace period), and the command it was running is killed with the sandbox, the
    child its shell forks meanwhile too (one round of killing tagged processes left it running
    on the process backend about every other time)."""
    async def go():
        sb = await make(backend).start()
        task = asyncio.ensure_future(sb.exec(["/bin/sh", "-c", "sleep 4324; true"], timeout=60))  # sh forks sleep
        deadline = time.monotonic() + 20
        while not any(supervisor_processes(os.getpid()).values()):  # the command is running
            assert time.monotonic() < deadline, "the command never started"
            await asyncio.sleep(0.02)
        [(pid, running)] = supervisor_processes(os.getpid()).items()
        os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(SandboxCrashedError, match="supervisor died while exec"):
            await task
        return sb, time.monotonic() - start, running

    sb, seconds, running = run(go())
    assert len(running) == 1 and seconds < 5, seconds
    assert sb.closed and not (state_root() / sb.state.id).exists()
    assert host_processes_with("sleep 4324") == []


def test_bad_input_gets_clear_errors():
    regs = installed_registries()
    with pytest.raises(UnknownPluginError, match="Did you mean 'bwrap'"):
        regs.sandbox.get("bwarp", key="data_sources[0].sandbox.type")
    with pytest.raises(ConfigError, match=r"sandbox\.memory_mb: must be a positive number, got -1"):
        sandbox_class("bwrap")({"memory_mb": -1})
    with pytest.raises(ConfigError, match=r"sandbox\.timeout_s"):
        sandbox_class("process")({"timeout_s": 0, "allow_untrusted_code": True})
    with pytest.raises(ConfigError, match=r"sandbox\.memroy_mb: unknown field"):
        sandbox_class("bwrap")({"memroy_mb": 100})
    with pytest.raises(SandboxUnavailableError, match="apt-get install -y bubblewrap"):
        sandbox_class("bwrap")({"bwrap_path": "no-such-bwrap"})
    with pytest.raises(ConfigError, match=r"exec\.timeout"):
        async def bad_timeout():
            async with sandbox_class("process")(untrusted=False) as sb:
                await sb.exec("true", timeout=-1)
        run(bad_timeout())


def test_process_backend_refuses_untrusted_code_unless_allowed():
    cls = sandbox_class("process")
    with pytest.raises(UntrustedCodeRefusedError, match="allow_untrusted_code: true"):
        cls()
    with pytest.raises(UntrustedCodeRefusedError):
        cls({"allow_untrusted_code": False}, untrusted=True)
    assert cls(untrusted=False).params.allow_untrusted_code is False
    assert cls({"allow_untrusted_code": True}).untrusted is True


def test_registry_entries_build_typed_params():
    entry = installed_registries().sandbox.entry("bwrap")
    params = entry.build_params({"memory_mb": 512, "ro_binds": ["/usr/share"]}, key="data_sources[0].sandbox")
    sb = entry.obj(params)
    assert (sb.params.memory_mb, sb.params.ro_binds, sb.params.cpu_time_s) == (512, ["/usr/share"], 2)
    assert sorted(installed_registries().sandbox.names()) == ["bwrap", "docker", "process", "remote"]


@pytest.mark.parametrize("backend", LOCAL)
@pytest.mark.parametrize("yields", [1, 2, 3])
def test_a_cancelled_close_still_kills_and_leaves_nothing_to_the_garbage_collector(
        backend, yields, monkeypatch):
    """An async run stopping with tool calls in flight cancels sandboxes mid-close: the
    supervisor must still be killed and our pipe to it closed on the loop (garbage collection
    after the loop is gone raised 'Event loop is closed')."""
    import gc
    import sys

    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    async def go():
        sb = await make(backend).start()
        await sb.exec(["true"])
        pid = sb._proc.pid
        closing = asyncio.ensure_future(sb.close())
        for _ in range(yields):  # into the graceful shutdown's awaits
            await asyncio.sleep(0)
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        return sb, pid

    loop = asyncio.new_event_loop()
    sb, pid = loop.run_until_complete(go())
    loop.close()
    state = state_root() / sb.state.id
    del sb
    gc.collect()
    assert [repr(u.exc_value) for u in unraisable] == []
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    assert not state.exists()


@pytest.mark.parametrize("backend", LOCAL)
def test_cancelling_an_exec_tears_the_sandbox_down(backend):
    async def go():
        sb = await make(backend).start()
        task = asyncio.ensure_future(sb.exec(["sleep", "4322"], timeout=30))
        await asyncio.sleep(0.5)
        running = len(host_processes_with("sleep 4322"))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.2)
        return sb, running

    sb, running = run(go())
    assert running == 1
    assert sb.closed and not (state_root() / sb.state.id).exists()
    assert host_processes_with("sleep 4322") == []
