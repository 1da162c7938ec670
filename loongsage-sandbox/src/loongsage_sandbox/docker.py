"""``docker`` backend: the supervisor inside a locked-down container, for hosts with a Docker engine.

``docker run -i --rm`` with no network, a read-only root file system, tmpfs ``/work`` and
``/tmp`` capped at ``disk_mb``, ``--memory``/``--pids-limit``/``--cpus`` as cgroup limits on
the whole container (on top of the per-process rlimits the supervisor applies), user 65534, all
capabilities dropped, ``no-new-privileges``, and ``--init`` so orphans are reaped. The
container is labelled with the sandbox id, so ``cleanup_leftovers`` finds it after a crash.
The supervisor's source is piped in on stdin before the JSON protocol starts (no bind mount of
a host path is needed, which also works against a remote engine).

The image must provide ``python3`` (default ``python:3.11-slim``); with ``pull: false`` a
missing image is an error that says how to get it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

from loongsage_sandbox.supervisor_client import SUPERVISOR_SOURCE, SupervisedSandbox
from loongsage_sandbox.errors import SandboxUnavailableError
from loongsage_sandbox.params import DockerParams

# Reads exactly N bytes of supervisor source from stdin, then runs it with stdin left for the protocol.
_BOOTSTRAP = ("import sys;n=int(sys.argv[1]);src=b''\n"
              "while len(src)<n:\n c=sys.stdin.buffer.read1(n-len(src))\n"
              " if not c: raise SystemExit('short supervisor source')\n src+=c\n"
              "sys.argv=[sys.argv[0]]+sys.argv[2:];g={'__name__':'__main__'};exec(compile(src,'supervisor.py','exec'),g)")


class DockerSandbox(SupervisedSandbox):
    """Docker container: no network, read-only root, cgroup memory/pids/cpu caps, tmpfs /work."""

    params_type = DockerParams
    backend = "docker"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._docker = shutil.which(self.params.docker_path)
        if self._docker is None:
            raise SandboxUnavailableError(
                f"{self.key}.docker_path: '{self.params.docker_path}' not found; the docker sandbox "
                f"needs a Docker client and engine (https://docs.docker.com/engine/install/)")
        self._source = SUPERVISOR_SOURCE.read_bytes()

    def _check_engine(self) -> None:
        try:
            info = subprocess.run([self._docker, "version", "--format", "{{.Server.Version}}"],
                                  capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise SandboxUnavailableError(f"{self.key}: docker engine not reachable: {err}") from None
        if info.returncode != 0:
            raise SandboxUnavailableError(f"{self.key}: docker engine not reachable: {info.stderr.strip()}")
        image = self.params.image
        has = subprocess.run([self._docker, "image", "inspect", image], capture_output=True, timeout=20)
        if has.returncode != 0:
            if not self.params.pull:
                raise SandboxUnavailableError(
                    f"{self.key}.image: image '{image}' is not present; run 'docker pull {image}' "
                    f"or set {self.key}.pull: true")
            subprocess.run([self._docker, "pull", image], check=True, capture_output=True, timeout=600)

    def _launch_argv(self, supervisor_config: dict[str, Any]) -> list[str]:
        p = self.params
        disk = f"{int(p.disk_mb)}m"
        supervisor_config.update(workdir="/work", pidns=True, scratch_dirs=["/tmp"])
        mem = int(p.memory_mb) * max(2, min(int(p.max_processes), 8))
        return [
            self._docker, "run", "-i", "--rm", "--init", "--name", self.state.id,
            "--label", f"loongsage.sandbox.id={self.state.id}",
            "--network", "none", "--read-only", "--user", "65534:65534",
            "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--memory", f"{mem}m", "--memory-swap", f"{mem}m",
            "--pids-limit", str(int(p.max_processes) + 8), "--cpus", str(p.cpus),
            "--tmpfs", f"/work:rw,size={disk},mode=1777", "--tmpfs", f"/tmp:rw,size={disk},mode=1777",
            "--workdir", "/work", "--hostname", "sandbox",
            p.image, p.python, "-I", "-S", "-c", _BOOTSTRAP, str(len(self._source)),
            json.dumps(supervisor_config),
        ]

    async def _start(self) -> None:
        import asyncio

        await asyncio.to_thread(self._check_engine)
        await super()._start()

    async def _read_reply(self, wait_s: float, what: str) -> dict[str, Any]:
        if what == "starting" and self._source is not None:
            source, self._source = self._source, None
            self._proc.stdin.write(source)
            await self._proc.stdin.drain()
        return await super()._read_reply(wait_s, what)

    async def _after_close(self) -> None:
        import asyncio

        def remove() -> None:
            subprocess.run([self._docker, "rm", "-f", self.state.id], capture_output=True, timeout=30)

        await asyncio.to_thread(remove)

    def describe(self) -> str:
        return f"docker ({self.params.image}, no network, uid 65534)"
