"""Typed parameters of every sandbox backend (torch-free; imported by ``plugin.py``).

A data source's ``sandbox:`` config is ``{type: bwrap, memory_mb: 512, ...}``: ``type`` picks
the registered backend and the rest fills that backend's dataclass below. The limit
defaults are the ones measured for the tests in loongsage-sandbox/tests (address space 256 MB, CPU 2
s, file size 1 MB, 64 open files); wall time, processes and disk are ours.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from loongsage.plugin import ConfigError


@dataclass
class SandboxParams:
    """Limits shared by every backend; each applies per command (rlimits) or per sandbox."""

    timeout_s: float = 10.0  # wall time of one exec; the whole process tree is killed after it
    cpu_time_s: int = 2  # RLIMIT_CPU per process (SIGKILL at the hard limit)
    memory_mb: int = 256  # RLIMIT_AS per process
    max_processes: int = 64  # RLIMIT_NPROC: processes of the sandbox user (fork bombs)
    max_file_size_mb: int = 1  # RLIMIT_FSIZE: largest file a command may write (EFBIG)
    max_open_files: int = 64  # RLIMIT_NOFILE
    disk_mb: int = 64  # size of the work dir (and of /tmp) where the backend can cap it
    max_output_kb: int = 1024  # stdout and stderr are each cut here (flagged as truncated)
    env: Dict[str, str] = field(default_factory=dict)  # extra environment for every command

    def validate(self, key: str = "sandbox") -> None:
        """Raise ``ConfigError`` naming the field when a limit is out of range."""
        positive = ("timeout_s", "cpu_time_s", "memory_mb", "max_processes",
                    "max_file_size_mb", "max_open_files", "disk_mb", "max_output_kb")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"{key}.{name}", f"must be a positive number, got {value!r}")
        if self.memory_mb < 16:
            raise ConfigError(f"{key}.memory_mb", f"must be at least 16 (MB), got {self.memory_mb}")
        if self.max_open_files < 8:
            raise ConfigError(f"{key}.max_open_files", f"must be at least 8, got {self.max_open_files}")
        for k, v in self.env.items():
            if not isinstance(k, str) or not isinstance(v, str) or "=" in k or not k:
                raise ConfigError(f"{key}.env", f"entries must be NAME: value strings, got {k!r}: {v!r}")

    def rlimits(self) -> dict[str, int | float]:
        """The per-command limits as the in-sandbox supervisor expects them."""
        return {
            "timeout_s": float(self.timeout_s),
            "cpu_time_s": int(self.cpu_time_s),
            "memory_bytes": int(self.memory_mb) << 20,
            "max_processes": int(self.max_processes),
            "max_file_size_bytes": int(self.max_file_size_mb) << 20,
            "max_open_files": int(self.max_open_files),
        }

    def limit_fields(self) -> dict[str, Any]:
        """The shared limit fields only (what a remote client forwards to the service)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(SandboxParams)}


@dataclass
class ProcessParams(SandboxParams):
    """Plain subprocess with rlimits and a private work dir; NOT a security boundary."""

    allow_untrusted_code: bool = False  # must be set explicitly to run model-written code


@dataclass
class BwrapParams(SandboxParams):
    """bubblewrap: new user/pid/net/ipc/uts namespaces, read-only system dirs, tmpfs work dir."""

    bwrap_path: str = "bwrap"  # the bubblewrap executable: a name on PATH or a path
    python: str = "/usr/bin/python3"  # interpreter inside the sandbox (runs the supervisor and user code)
    ro_binds: List[str] = field(default_factory=list)  # extra host paths mounted read-only
    host_uid: Optional[int] = None  # when run as root: unprivileged host uid (default 200000+slot)


@dataclass
class DockerParams(SandboxParams):
    """Docker container: no network, read-only root, capped memory/pids, tmpfs work dir."""

    docker_path: str = "docker"  # the docker executable: a name on PATH or a path
    image: str = "python:3.11-slim"  # the container image (present locally unless pull)
    python: str = "python3"  # interpreter inside the container (runs the supervisor and user code)
    cpus: float = 1.0  # docker run --cpus: CPU share of the container
    pull: bool = False  # pull the image if missing (otherwise it must already exist)


@dataclass
class RemoteParams(SandboxParams):
    """Client of a ``loongsage sandbox serve`` service (which runs its own backend)."""

    url: str = "http://127.0.0.1:8765"  # the service's http(s) URL
    token: Optional[str] = None  # defaults to the environment variable named by token_env
    token_env: str = "LOONGSAGE_SANDBOX_TOKEN"  # environment variable holding the token
    request_timeout_s: float = 60.0  # added to each exec's own timeout


def coerce_params(cls: type, params: Any, key: str = "sandbox") -> Any:
    """Turn ``None``, a mapping or an instance into a validated ``cls`` instance."""
    if params is None:
        obj = cls()
    elif isinstance(params, cls):
        obj = params
    elif isinstance(params, Mapping):
        values = {k: v for k, v in params.items() if k != "type"}
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError(f"{key}.{unknown[0]}", f"unknown field for {cls.__name__}; "
                              f"expected one of {sorted(names)}")
        obj = cls(**values)
    else:
        raise ConfigError(key, f"expected a mapping or {cls.__name__}, got {type(params).__name__}")
    obj.validate(key)
    return obj
