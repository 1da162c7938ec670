"""Cleanup after crashes and at exit (real crashed processes), and the ``loongsage sandbox`` CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from loongsage.plugin.testing import installed_registries

from loongsage_sandbox import cli
from loongsage_sandbox.testing import bwrap_unavailable_reason
from loongsage_sandbox.leftovers import cleanup_leftovers, state_root, tagged_processes

REGISTRIES = installed_registries()

BWRAP_REASON = bwrap_unavailable_reason()

CRASHING_RUN = textwrap.dedent("""
    import asyncio, json, os, signal, shutil
    from loongsage.plugin.testing import installed_registries
    from loongsage_sandbox.testing import bwrap_unavailable_reason

    async def main():
        reg = installed_registries().sandbox
        proc_sb = await reg.get("process")({"allow_untrusted_code": True}).start()
        await proc_sb.exec("sleep 5555 >/dev/null 2>&1 &")
        ids = [proc_sb.state.id]
        if bwrap_unavailable_reason() is None:
            bw = await reg.get("bwrap")().start()
            await bw.exec("sleep 5556 >/dev/null 2>&1 &")
            ids.append(bw.state.id)
        print(json.dumps(ids), flush=True)
        os.kill(proc_sb._proc.pid, signal.SIGKILL)  # the whole run dies: supervisor first,
        os.kill(os.getpid(), signal.SIGKILL)        # then the owner, with no chance to clean up

    asyncio.run(main())
""")

FORGETFUL_RUN = textwrap.dedent("""
    import asyncio, json
    from loongsage.plugin.testing import installed_registries

    async def main():
        sb = await installed_registries().sandbox.get("process")({"allow_untrusted_code": True}).start()
        await sb.exec("sleep 5557 >/dev/null 2>&1 &")
        print(json.dumps([sb.state.id]), flush=True)

    asyncio.run(main())  # exits without closing the sandbox
""")


def _run_script(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout.splitlines()[0])


def test_leftovers_of_a_crashed_run_are_removed_at_the_next_start():
    ids = _run_script(CRASHING_RUN)
    assert all((state_root() / sid).is_dir() for sid in ids)  # the crash left its state behind
    orphans = tagged_processes(set(ids))
    assert len(orphans) >= 1  # the process sandbox's sleeper survived its supervisor
    counts = cleanup_leftovers()
    assert counts["sandboxes"] == len(ids) and counts["processes"] >= 1
    assert not any((state_root() / sid).exists() for sid in ids)
    assert tagged_processes(set(ids)) == []
    assert cleanup_leftovers()["sandboxes"] == 0  # live sandboxes of this process are never touched


def test_unclosed_sandboxes_are_cleaned_at_interpreter_exit():
    ids = _run_script(FORGETFUL_RUN)
    assert not (state_root() / ids[0]).exists()
    assert tagged_processes(set(ids)) == []


@pytest.mark.skipif(BWRAP_REASON is not None, reason=str(BWRAP_REASON))
def test_cli_run_reports_exit_timeout_and_errors(capfd):
    """The sandbox command as core's CLI calls it: ``main(argv, registries)``."""
    assert cli.main(["run", "--", "sh", "-c", "echo hello; id -u; exit 3"], REGISTRIES) == 3
    out, err = capfd.readouterr()
    assert out == "hello\n65534\n"
    assert "[sandbox: bwrap" in err and "[sandbox: exit 3;" in err
    assert cli.main(["run", "--timeout", "0.5", "--", "sleep", "5"], REGISTRIES) == 124
    assert "timed out, process tree killed" in capfd.readouterr().err
    assert cli.main(["run", "--type", "bwarp", "--", "true"], REGISTRIES) == 2
    assert "--type: unknown sandbox 'bwarp'. Did you mean 'bwrap'?" in capfd.readouterr().err
    assert cli.main(["run", "--memory", "8M", "--", "true"], REGISTRIES) == 2
    assert "sandbox.memory_mb: must be at least 16" in capfd.readouterr().err
    assert cli.main(["run"], REGISTRIES) == 2
    assert "no command given" in capfd.readouterr().err


def test_cli_through_the_loongsage_command():
    exe = os.path.join(os.path.dirname(sys.executable), "loongsage")
    if not os.path.exists(exe):
        pytest.skip("the loongsage console script is not installed in this environment")
    out = subprocess.run([exe, "sandbox", "run", "--type", "process", "--", "python3", "-c", "print(6 * 7)"],
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (0, "42\n")
    assert "not a security boundary" in out.stderr
    cleaned = subprocess.run([exe, "sandbox", "cleanup"], capture_output=True, text=True, timeout=60)
    assert cleaned.returncode == 0 and cleaned.stdout.startswith("removed ")
