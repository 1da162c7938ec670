"""A server the environments start as a child process: its log, its end with the parent, its stop.

Both the OpenEnv and the verifiers adapters run their environment's server in a process of its
own on loopback. It writes into a temporary log (read back when it fails to start), gets
SIGTERM when the thread that started it ends (``PR_SET_PDEATHSIG``: start it from a thread that
outlives it), and is stopped at exit: SIGTERM, then SIGKILL after 10 s.
"""

from __future__ import annotations

import atexit
import ctypes
import signal
import socket
import subprocess
import tempfile
from pathlib import Path


def free_port() -> int:
    """A loopback port free now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


class ServerProcess:
    """``argv`` started with its output in a temporary log named after ``log_prefix``."""

    def __init__(self, argv: list[str], log_prefix: str, env: dict[str, str] | None = None) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix=log_prefix, suffix=".log", delete=False)
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     preexec_fn=_die_with_parent)
        atexit.register(self.stop)

    def output(self) -> str:
        """What the server printed (its log, removed by ``stop``)."""
        path = Path(self.log.name)
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)
