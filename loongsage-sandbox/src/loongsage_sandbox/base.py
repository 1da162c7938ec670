"""The one async interface every sandbox backend implements, and its result types.

A backend is registered as a class; ``cls(params, files=..., untrusted=...)`` builds an
unstarted sandbox and ``async with`` starts it and guarantees ``close()``::

    Sandbox = registries.sandbox.get("bwrap")
    async with Sandbox({"memory_mb": 256}, files={"main.py": "print(1)"}) as sb:
        result = await sb.exec("python3 main.py", timeout=5)

Backends implement the ``_``-prefixed primitives; this class does argument checking, the
initial files (re-written after every ``reset``), and the lifecycle state.
"""

from __future__ import annotations

import abc
import shlex
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

from loongsage.plugin import ConfigError

from loongsage_sandbox.errors import SandboxClosedError
from loongsage_sandbox.params import SandboxParams, coerce_params


@dataclass
class ExecResult:
    """What one command did inside the sandbox."""

    exit_code: int | None  # None when the process was killed by a signal
    stdout: bytes
    stderr: bytes
    signal: int | None = None
    timed_out: bool = False  # the wall-time limit hit; the whole process tree was killed
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_s: float = 0.0
    killed_processes: int = 0  # processes found alive and killed after a timeout

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    def to_dict(self) -> dict[str, Any]:
        import base64

        d = dict(self.__dict__)
        d["stdout"] = base64.b64encode(self.stdout).decode()
        d["stderr"] = base64.b64encode(self.stderr).decode()
        return d

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "ExecResult":
        import base64

        names = cls.__dataclass_fields__
        values = {k: v for k, v in d.items() if k in names}
        values["stdout"] = base64.b64decode(d.get("stdout", ""))
        values["stderr"] = base64.b64decode(d.get("stderr", ""))
        return cls(**values)


@dataclass(frozen=True)
class FileEntry:
    name: str
    type: str  # "file" | "dir" | "symlink"
    size: int


@dataclass
class _State:
    started: bool = False
    closed: bool = False
    files: dict[str, bytes] = field(default_factory=dict)


class Sandbox(abc.ABC):
    """An isolated place to run commands and keep files, with a full lifecycle."""

    params_type: ClassVar[type[SandboxParams]] = SandboxParams
    backend: ClassVar[str] = "abstract"

    def __init__(self, params: Any = None, *, files: Mapping[str, bytes | str] | None = None,
                 untrusted: bool = True, key: str = "sandbox"):
        self.params = coerce_params(self.params_type, params, key)
        self.untrusted = untrusted
        self.key = key
        self._state = _State(files={p: _as_bytes(d) for p, d in (files or {}).items()})

    @classmethod
    def pool(cls, params: Any = None, *, size: int = 2, max_size: int | None = None,
             files: Mapping[str, bytes | str] | None = None, untrusted: bool = True) -> Any:
        """A ``SandboxPool`` of this backend (reachable from the registry, no import needed)."""
        from loongsage_sandbox.pool import SandboxPool

        return SandboxPool(cls, params, size=size, max_size=max_size, files=files, untrusted=untrusted)

    # -- lifecycle ---------------------------------------------------------------
    async def start(self) -> "Sandbox":
        if self._state.closed:
            raise SandboxClosedError(f"{self.backend} sandbox is closed; create a new one")
        if not self._state.started:
            self._state.started = True
            try:
                await self._start()
                await self._write_initial_files()
            except BaseException:
                await self.close()
                raise
        return self

    async def close(self) -> None:
        """Kill everything the sandbox runs and remove its state; safe to call twice."""
        if self._state.closed:
            return
        self._state.closed = True
        if self._state.started:
            await self._close()

    async def reset(self) -> None:
        """Kill all processes, empty the work dir, and restore the initial files."""
        self._check_open()
        await self._reset()
        await self._write_initial_files()

    @property
    def closed(self) -> bool:
        return self._state.closed

    async def __aenter__(self) -> "Sandbox":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- operations ----------------------------------------------------------------
    async def exec(self, command: str | Sequence[str], *, stdin: bytes | str | None = None,
                   timeout: float | None = None, env: Mapping[str, str] | None = None,
                   cwd: str = ".") -> ExecResult:
        """Run ``command`` (a shell string, or an argv list) in the work dir."""
        self._check_open()
        if isinstance(command, str):
            if not command.strip():
                raise ConfigError("exec.command", "must not be empty")
            argv = ["/bin/sh", "-c", command]
        else:
            argv = list(command)
            if not argv or not all(isinstance(a, str) for a in argv):
                raise ConfigError("exec.command", f"must be a string or a non-empty list of strings, got {command!r}")
        if timeout is not None and (isinstance(timeout, bool) or not timeout > 0):
            raise ConfigError("exec.timeout", f"must be a positive number of seconds, got {timeout!r}")
        return await self._exec(argv, _as_bytes(stdin) if stdin is not None else None,
                                float(timeout or self.params.timeout_s), dict(env or {}), cwd)

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self._check_open()
        await self._write(path, _as_bytes(data), mode)

    async def read_file(self, path: str, max_bytes: int = 16 << 20) -> bytes:
        self._check_open()
        return await self._read(path, max_bytes)

    async def list_files(self, path: str = ".") -> list[FileEntry]:
        self._check_open()
        return await self._list(path)

    def describe(self) -> str:
        """One line naming the backend and its isolation (for logs and the CLI)."""
        return self.backend

    def command_line(self, argv: Sequence[str]) -> str:
        return shlex.join(argv)

    # -- backend primitives ----------------------------------------------------------
    @abc.abstractmethod
    async def _start(self) -> None: ...

    @abc.abstractmethod
    async def _close(self) -> None: ...

    @abc.abstractmethod
    async def _reset(self) -> None: ...

    @abc.abstractmethod
    async def _exec(self, argv: list[str], stdin: bytes | None, timeout: float,
                    env: dict[str, str], cwd: str) -> ExecResult: ...

    @abc.abstractmethod
    async def _write(self, path: str, data: bytes, mode: int) -> None: ...

    @abc.abstractmethod
    async def _read(self, path: str, max_bytes: int) -> bytes: ...

    @abc.abstractmethod
    async def _list(self, path: str) -> list[FileEntry]: ...

    # -- helpers -----------------------------------------------------------------
    def _check_open(self) -> None:
        if self._state.closed:
            raise SandboxClosedError(f"{self.backend} sandbox is closed")
        if not self._state.started:
            raise SandboxClosedError(f"{self.backend} sandbox is not started; use 'async with' or await start()")

    async def _write_initial_files(self) -> None:
        for path, data in self._state.files.items():
            await self._write(path, data, 0o644)


def _as_bytes(data: bytes | str) -> bytes:
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise ConfigError("data", f"expected bytes or str, got {type(data).__name__}")
