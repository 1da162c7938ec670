"""The ``docker`` backend: real engine when present; otherwise its launch path through a stand-in.

This machine has no Docker engine, so the real-engine test skips with that reason. The
second test replaces the ``docker`` executable with a small script (a fake, because the
real thing cannot run here) that records the ``docker run`` arguments and runs the
container's command line directly on the host, in a temporary work dir. It checks the
isolation flags we pass and the supervisor bootstrap over stdin; it does NOT test isolation.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from tool_guard import optional_reason

from loongsage.plugin.testing import installed_registries
from loongsage_sandbox.errors import SandboxUnavailableError


def run(coro):
    return asyncio.run(coro)


def _engine_available() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        return subprocess.run([docker, "version"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _engine_available(),
                    reason=optional_reason("no Docker engine on this machine (docker backend needs one)"))
def test_real_docker_sandbox_has_no_network_and_a_read_only_root():
    async def go():
        async with installed_registries().sandbox.get("docker")({"pull": True}) as sb:
            net = await sb.exec(["python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 53), 2)"])
            ro = await sb.exec("touch /usr/x")
            work = await sb.exec("echo ok > f && cat f && id -u")
            return net, ro, work

    net, ro, work = run(go())
    assert net.exit_code != 0 and ro.exit_code != 0
    assert work.text == "ok\n65534\n"


FAKE_DOCKER = textwrap.dedent("""
    import json, os, sys
    args = sys.argv[1:]
    log, workdir = os.environ["FAKE_DOCKER_LOG"], os.environ["FAKE_DOCKER_WORKDIR"]
    with open(log, "a") as f:
        f.write(json.dumps(args) + "\\n")
    if args[0] == "run":
        image_at = args.index("fake/python:1")
        cmd = args[image_at + 1:]
        config = json.loads(cmd[-1])
        config.update(workdir=workdir, scratch_dirs=[])  # never touch /work, /tmp of this host
        cmd[-1] = json.dumps(config)
        os.execv(sys.executable, [sys.executable] + cmd[1:])
    print("fake-1.0" if args[0] == "version" else "")
""")


def test_docker_launch_flags_and_supervisor_bootstrap(tmp_path, monkeypatch):
    script = tmp_path / "docker"
    script.write_text(f"#!{sys.executable}\n" + FAKE_DOCKER)
    script.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(log))
    monkeypatch.setenv("FAKE_DOCKER_WORKDIR", str(tmp_path / "work"))
    cls = installed_registries().sandbox.get("docker")

    async def go():
        async with cls({"docker_path": str(script), "image": "fake/python:1", "python": "python3",
                        "memory_mb": 128, "max_processes": 16, "disk_mb": 32},
                       files={"hello.py": "print('hi from the container')"}) as sb:
            out = await sb.exec(["python3", "hello.py"])
            sid = sb.state.id
        return out, sid

    out, sid = run(go())
    assert out.text == "hi from the container\n"
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    run_args = next(c for c in calls if c[0] == "run")
    joined = " ".join(run_args)
    for flag in ("--network none", "--read-only", "--user 65534:65534", "--cap-drop ALL",
                 "--security-opt no-new-privileges", "--pids-limit 24", "--memory 1024m",
                 "--tmpfs /work:rw,size=32m,mode=1777", f"--label loongsage.sandbox.id={sid}", "--init"):
        assert flag in joined, flag
    assert ["rm", "-f", sid] in calls  # the container is removed on close


def test_docker_missing_is_a_clear_error():
    with pytest.raises(SandboxUnavailableError, match="docker_path: 'no-such-docker' not found"):
        installed_registries().sandbox.get("docker")({"docker_path": "no-such-docker"})
