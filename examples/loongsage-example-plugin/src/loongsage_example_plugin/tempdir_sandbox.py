"""A sandbox running commands as plain subprocesses in a temporary folder: the sandbox
contract with no isolation at all, so it refuses untrusted code unless told otherwise."""

import asyncio
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from loongsage.plugin import ConfigError, LoongSageError


@dataclass
class ExecResult:
    """What one command did (the fields loongsage-sandbox's results have too)."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class TempdirSandbox:
    """Subprocesses in a fresh temporary work folder; the files API is confined to it."""

    def __init__(self, params, files=None, untrusted=True, key="sandbox"):
        if untrusted and not params.allow_untrusted_code:
            raise ConfigError(f"{key}.type", "the 'tempdir' sandbox isolates nothing and refuses untrusted "
                              f"code; set {key}.allow_untrusted_code: true if the code is yours")
        self.params, self._files, self._dir = params, dict(files or {}), None

    @classmethod
    def pool(cls, params, *, size=2, files=None, untrusted=True):
        """``size`` fresh, unstarted sandboxes (this backend keeps no warm state to pool)."""
        return [cls(params, files=files, untrusted=untrusted) for _ in range(size)]

    async def __aenter__(self):
        self._dir = Path(tempfile.mkdtemp(prefix="loongsage-tempdir-"))
        for path, data in self._files.items():
            await self.write_file(path, data)
        return self

    async def __aexit__(self, *exc):
        await self.close()

    def _path(self, path):
        if self._dir is None:
            raise LoongSageError("tempdir sandbox: not started (use it as `async with`)")
        full = (self._dir / path).resolve()
        if not full.is_relative_to(self._dir.resolve()):
            raise LoongSageError(f"tempdir sandbox: {path!r} is outside the sandbox")
        return full

    async def exec(self, command, *, stdin=None, timeout=None):
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        start = time.monotonic()
        pipe = asyncio.subprocess.PIPE
        proc = await asyncio.create_subprocess_exec(*argv, cwd=self._path("."), stdin=pipe, stdout=pipe,
                                                    stderr=pipe)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        try:
            out, err = await asyncio.wait_for(proc.communicate(data), timeout or self.params.timeout_s)
        except asyncio.TimeoutError:
            proc.kill()
            out, err = await proc.communicate()
            return ExecResult(None, out, err, timed_out=True, duration_s=time.monotonic() - start)
        return ExecResult(proc.returncode, out, err, duration_s=time.monotonic() - start)

    async def write_file(self, path, data, mode=0o644):
        full = self._path(path)
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_bytes(data.encode() if isinstance(data, str) else data)
        full.chmod(mode)

    async def read_file(self, path, max_bytes=16 << 20):
        with open(self._path(path), "rb") as handle:
            return handle.read(max_bytes)

    async def list_files(self, path="."):
        return sorted(p.name for p in self._path(path).iterdir())

    async def reset(self):
        await self.close()
        await self.__aenter__()

    async def close(self):
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
