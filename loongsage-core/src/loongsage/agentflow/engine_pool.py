"""Engine replicas behind the router: sticky per trajectory, least-loaded for new ones.

A trajectory keeps its replica for its whole life (the replica's prefix cache holds its
tokens). A new trajectory goes to the replica with the fewest in-flight requests, ties
broken by the fewest sticky trajectories, then by index. At most ``max_inflight`` requests
per replica are sent at once; the rest wait in the router (cheap) rather than piling
connections onto a busy engine.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Hashable


class EnginePool:
    def __init__(self, clients: list[Any], max_inflight: int = 64) -> None:
        if not clients:
            raise ValueError("agentflow: the router needs at least one engine replica")
        if max_inflight < 1:
            raise ValueError("agentflow.max_inflight_per_engine: must be >= 1")
        self.clients = list(clients)
        self.max_inflight = max_inflight
        self._gates: list[asyncio.Semaphore] | None = None  # made in the serving loop
        self.inflight = [0] * len(clients)
        self.sessions = [0] * len(clients)
        self._sticky: dict[Hashable, int] = {}

    def pick(self, key: Hashable) -> int:
        """The replica index for ``key`` (assigned on first use)."""
        idx = self._sticky.get(key)
        if idx is None:
            idx = min(range(len(self.clients)),
                      key=lambda i: (self.inflight[i], self.sessions[i], i))
            self._sticky[key] = idx
            self.sessions[idx] += 1
        return idx

    @asynccontextmanager
    async def busy(self, idx: int) -> AsyncIterator[Any]:
        """Count a request against replica ``idx`` and wait for one of its send slots."""
        if self._gates is None:
            self._gates = [asyncio.Semaphore(self.max_inflight) for _ in self.clients]
        self.inflight[idx] += 1
        try:
            async with self._gates[idx]:
                yield self.clients[idx]
        finally:
            self.inflight[idx] -= 1

    def release(self, key: Hashable) -> None:
        idx = self._sticky.pop(key, None)
        if idx is not None:
            self.sessions[idx] -= 1
