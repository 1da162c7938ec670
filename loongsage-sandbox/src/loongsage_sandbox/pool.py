"""A pool that pre-warms sandboxes and lends one to each trajectory, then resets and reuses it.

Starting a bwrap sandbox costs a namespace set-up and a Python start (tens of ms); a reset
costs one round trip. Agents run many short commands per trajectory and many trajectories
per step, so the pool keeps ``size`` sandboxes started ahead of demand, gives a trajectory
the same sandbox for all of its calls (its files persist between commands), and on
``release`` resets it (kills its processes, empties ``/work``, restores initial files)
before the next trajectory gets it. A sandbox that crashed or fails its reset is closed and
replaced, never lent again. At most ``max_size`` sandboxes exist; further ``acquire`` calls
wait. ``close()`` (or leaving ``async with``) closes every sandbox, lent or idle.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Mapping

from loongsage.plugin import ConfigError

from loongsage_sandbox.base import Sandbox
from loongsage_sandbox.errors import SandboxClosedError, SandboxError


@dataclass
class PoolStats:
    created: int = 0
    lent: int = 0
    reused: int = 0
    resets: int = 0
    replaced: int = 0


class SandboxPool:
    """Pre-warmed, per-trajectory sandboxes of one backend and one set of parameters."""

    def __init__(self, factory: Callable[..., Sandbox], params: Any = None, *, size: int = 2,
                 max_size: int | None = None, files: Mapping[str, bytes | str] | None = None,
                 untrusted: bool = True):
        if not isinstance(size, int) or size < 0:
            raise ConfigError("pool.size", f"must be an integer >= 0, got {size!r}")
        max_size = max(size, 1) if max_size is None else max_size
        if not isinstance(max_size, int) or max_size < max(size, 1):
            raise ConfigError("pool.max_size", f"must be an integer >= max(size, 1) = {max(size, 1)}, got {max_size!r}")
        self._make = lambda: factory(params, files=files, untrusted=untrusted)
        self._make()  # validate parameters now, not at the first acquire (an unstarted sandbox costs nothing)
        self.size, self.max_size = size, max_size
        self._idle: list[Sandbox] = []
        self._lent: dict[str, Sandbox] = {}
        self._count = 0  # sandboxes existing or being created
        self._cond = asyncio.Condition()
        self._tasks: set[asyncio.Task] = set()
        self._closed = False
        self.stats = PoolStats()

    async def start(self) -> "SandboxPool":
        """Start ``size`` sandboxes now (in parallel)."""
        await asyncio.gather(*(self._add_one() for _ in range(self.size - self._count)))
        return self

    async def __aenter__(self) -> "SandboxPool":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _add_one(self) -> None:
        async with self._cond:
            if self._closed or self._count >= self.max_size:
                return
            self._count += 1
        try:
            sb = await self._make().start()
        except BaseException:
            async with self._cond:
                self._count -= 1
                self._cond.notify_all()
            raise
        self.stats.created += 1
        async with self._cond:
            if self._closed:
                self._count -= 1
                await sb.close()
                return
            self._idle.append(sb)
            self._cond.notify_all()

    def _refill(self) -> None:
        missing = self.size - len(self._idle) - max(0, self._count - len(self._idle) - len(self._lent))
        if self._closed or self._count >= self.max_size or missing <= 0:
            return
        task = asyncio.ensure_future(self._add_one())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def acquire(self, trajectory_id: str) -> Sandbox:
        """The sandbox of ``trajectory_id``: the one it already holds, else an idle one."""
        if self._closed:
            raise SandboxClosedError("sandbox pool is closed")
        while True:
            async with self._cond:
                if trajectory_id in self._lent:  # also when a concurrent acquire got there first
                    return self._lent[trajectory_id]
                if self._idle:
                    sb = self._idle.pop()
                    self._lent[trajectory_id] = sb
                    self.stats.lent += 1
                    self._refill()
                    return sb
                can_create = self._count < self.max_size
                if not can_create:
                    await self._cond.wait()
                    if self._closed:
                        raise SandboxClosedError("sandbox pool is closed")
                    continue
            await self._add_one()

    async def release(self, trajectory_id: str) -> None:
        """Give the trajectory's sandbox back: reset it for reuse, or replace it if broken."""
        async with self._cond:
            sb = self._lent.pop(trajectory_id, None)
        if sb is None:
            raise ConfigError("pool.release", f"trajectory {trajectory_id!r} holds no sandbox")
        try:
            if sb.closed:
                raise SandboxClosedError("closed while lent")
            await sb.reset()
            self.stats.resets += 1
        except SandboxError:
            await sb.close()
            self.stats.replaced += 1
            async with self._cond:
                self._count -= 1
                self._cond.notify_all()
                self._refill()
            return
        async with self._cond:
            if self._closed:
                await sb.close()
                return
            self.stats.reused += 1
            self._idle.append(sb)
            self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def session(self, trajectory_id: str) -> AsyncIterator[Sandbox]:
        """``async with pool.session(tid) as sb``: acquire, then release even on errors."""
        sb = await self.acquire(trajectory_id)
        try:
            yield sb
        finally:
            await self.release(trajectory_id)

    async def close(self) -> None:
        async with self._cond:
            self._closed = True
            everything = self._idle + list(self._lent.values())
            self._idle, self._lent = [], {}
            self._cond.notify_all()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(sb.close() for sb in everything), return_exceptions=True)

    @property
    def idle(self) -> int:
        return len(self._idle)
