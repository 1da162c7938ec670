"""verifiers' env server as a child process: the episodes of one verifiers environment.

prime-rl runs verifiers environments this way (github.com/PrimeIntellect-ai/verifiers,
``verifiers.v1.serve``): ``serve_env`` serves one environment over ZMQ, and each
``EnvClient.run(client, model, sampling, task_data)`` runs one episode with verifiers' own
logic (setup, the harness program, tool servers, finalize, scoring) against the client config
of that request, so every episode can call its own URL. Here the server is started with
``python -m loongsage_agents.environments.verifiers_server CONFIG_JSON`` on a free loopback
port, as a child process that dies with this one (``PR_SET_PDEATHSIG``), with this
interpreter's ``bin`` directory first on ``PATH``: verifiers runs harness programs as ``uv``
scripts, and the ``uv`` of the ``[verifiers]`` extra lives there. Sources of one process with
the same environment config (a training source and its held-out twin) share one server.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from loongsage_agents.environments.server_process import ServerProcess, free_port


class EnvServerProcess(ServerProcess):
    """verifiers' env server for one environment config, on loopback, stopped at exit.

    Started from the event loop's thread (``PR_SET_PDEATHSIG`` follows the thread that forked)."""

    def __init__(self, config_data: dict[str, Any], name: str) -> None:
        self.name = name
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.healthy = False  # set once it answered its health check
        bin_dir = str(Path(sys.executable).parent)
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
        # serve_env turns SIGTERM into its own orderly teardown
        super().__init__([sys.executable, "-m", __name__, self.address, json.dumps(config_data)],
                         f"verifiers-{name}-", env)

    async def wait_healthy(self, timeout: float) -> None:
        from verifiers.v1.serve import EnvClient

        if self.healthy:
            return
        client = EnvClient(self.address)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"verifiers' env server of {self.name!r} exited with "
                                       f"{self.proc.returncode}: {self.output()[-2000:]}")
                if await client.health(timeout=1.0):
                    self.healthy = True
                    return
                await asyncio.sleep(0.2)
        finally:
            await client.close()
        output = self.output()
        self.stop()
        raise RuntimeError(f"verifiers' env server of {self.name!r} did not answer at {self.address} within "
                           f"{timeout:g} s (server_start_timeout_s): {output[-2000:]}")


_servers: dict[str, EnvServerProcess] = {}  # by environment config (JSON)
_servers_lock = threading.Lock()


def shared_server(config_data: dict[str, Any], name: str) -> EnvServerProcess:
    """The process's env server of this config, started on first use and again if it died."""
    key = json.dumps(config_data, sort_keys=True)
    with _servers_lock:
        server = _servers.get(key)
        if server is None or server.proc.poll() is not None:
            if server is not None:
                server.stop()
            server = _servers[key] = EnvServerProcess(config_data, name)
        return server


def main(address: str, config_json: str) -> None:
    import logging

    from verifiers.v1.serve import serve_env

    # warnings and errors, and the server's own lines (up, down, a cancelled run): a long run's
    # per-rollout lines (verifiers' rollout log, every HTTP request) would only grow the log
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("verifiers.v1.serve").setLevel(logging.INFO)
    serve_env(max_workers=1, address=address, config_data=json.loads(config_json))


if __name__ == "__main__":
    main(*sys.argv[1:3])
