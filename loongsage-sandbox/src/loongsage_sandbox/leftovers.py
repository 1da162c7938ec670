"""Per-sandbox state directories, and cleanup of what a crashed run left behind.

Every sandbox gets ``<state root>/<id>/`` holding ``owner.json`` (the owning process's pid
and start time) and, for the ``process`` backend, the work dir itself. Every process a
sandbox starts carries ``LOONGSAGE_SANDBOX_ID=<id>`` in its environment, and docker
containers carry the id as a label. A sandbox closed normally removes all of it; an
``atexit`` hook closes what is still open at interpreter exit. What survives a hard crash
(SIGKILL, OOM kill, power loss of a remote service) is removed by ``cleanup_leftovers()``,
which runs once per process before the first sandbox starts and from
``loongsage sandbox cleanup``: it kills processes still tagged with the id of a sandbox
whose owner is gone, removes its containers, and deletes its directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ENV_MARKER = "LOONGSAGE_SANDBOX_ID"
_cleaned_once = False


def state_root() -> Path:
    """``$LOONGSAGE_SANDBOX_STATE_DIR``, else ``<tmp>/loongsage-sandbox-<uid>``."""
    root = os.environ.get("LOONGSAGE_SANDBOX_STATE_DIR") or os.path.join(
        tempfile.gettempdir(), f"loongsage-sandbox-{os.getuid()}")
    path = Path(root)
    path.mkdir(mode=0o711, parents=True, exist_ok=True)
    return path


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


@dataclass
class StateDir:
    """One sandbox's directory and owner record."""

    id: str
    path: Path

    @classmethod
    def create(cls, backend: str) -> "StateDir":
        sid = f"{backend}-{uuid.uuid4().hex[:12]}"
        path = state_root() / sid
        path.mkdir(mode=0o711)
        pid = os.getpid()
        record = {"owner_pid": pid, "owner_start": _start_time(pid), "backend": backend}
        (path / "owner.json").write_text(json.dumps(record))
        return cls(sid, path)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _owner_alive(record: dict) -> bool:
    pid = record.get("owner_pid")
    return isinstance(pid, int) and _start_time(pid) is not None and _start_time(pid) == record.get("owner_start")


def tagged_processes(sandbox_ids: set[str]) -> list[int]:
    """Pids of processes whose environment carries one of ``sandbox_ids``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    continue
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(ENV_MARKER.encode() + b"=") and item.split(b"=", 1)[1].decode(errors="replace") in sandbox_ids:
                found.append(int(name))
                break
    return found


def _remove_containers(sandbox_ids: set[str]) -> int:
    docker = shutil.which("docker")
    if not docker or not sandbox_ids:
        return 0
    try:
        out = subprocess.run([docker, "ps", "-aq", "--filter", "label=loongsage.sandbox.id"],
                             capture_output=True, text=True, timeout=10)
        ids = []
        for cid in out.stdout.split():
            label = subprocess.run([docker, "inspect", "-f", '{{index .Config.Labels "loongsage.sandbox.id"}}', cid],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            if label in sandbox_ids:
                ids.append(cid)
        if ids:
            subprocess.run([docker, "rm", "-f", *ids], capture_output=True, timeout=30)
        return len(ids)
    except (OSError, subprocess.TimeoutExpired):
        return 0


def cleanup_leftovers() -> dict[str, int]:
    """Remove sandboxes whose owning process is gone; returns counts of what was removed."""
    global _cleaned_once
    _cleaned_once = True
    dead: dict[str, Path] = {}
    for path in state_root().iterdir():
        try:
            record = json.loads((path / "owner.json").read_text())
        except (OSError, ValueError):
            record = {}
            try:
                if time.time() - path.stat().st_mtime < 30:
                    continue  # being created right now by another process
            except OSError:
                continue
        if not _owner_alive(record):
            dead[path.name] = path
    killed = 0
    for _ in range(5 if dead else 0):  # tagged processes may fork while being killed
        pids = tagged_processes(set(dead))
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
    containers = _remove_containers(set(dead))
    for path in dead.values():
        shutil.rmtree(path, ignore_errors=True)
    return {"sandboxes": len(dead), "processes": killed, "containers": containers}


def cleanup_once() -> None:
    """Run ``cleanup_leftovers`` the first time a sandbox starts in this process."""
    if not _cleaned_once:
        cleanup_leftovers()
