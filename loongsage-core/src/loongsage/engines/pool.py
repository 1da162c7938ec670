"""The one load balancer over a run's rollout engines: sticky per session, least-loaded else.

A session (a router trajectory) keeps its replica for its whole life, so the replica's
prefix cache holds its tokens; a new session, or a request without one, goes to the replica
with the fewest in-flight requests, ties broken by the fewest sticky sessions, then by
index. At most ``max_inflight`` requests per replica are sent at once; the rest wait here
(cheap) rather than piling connections onto a busy engine.

The pool is itself an engine client (``agenerate``, ``astream_generate``, ``aabort``), so a
white-box agent given the pool and the AgentFlow router built over the same pool share one
set of in-flight counts: a run balances its engines in one place. ``take_served`` reports
how many requests each replica got since it was last asked (a step's
``rollout/engine_requests/<i>``).
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Hashable, Sequence


class EnginePool:
    def __init__(self, clients: Sequence[Any], max_inflight: int = 64) -> None:
        if not clients:
            raise ValueError("the engine pool needs at least one engine replica")
        if max_inflight < 1:
            raise ValueError("agentflow.max_inflight_per_engine: must be >= 1")
        self.clients = list(clients)
        self.max_inflight = max_inflight
        self._gates: list[asyncio.Semaphore] | None = None  # made in the serving loop
        self.inflight = [0] * len(self.clients)
        self.sessions = [0] * len(self.clients)
        self.served = [0] * len(self.clients)
        self._sticky: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return len(self.clients)

    def least_loaded(self) -> int:
        return min(range(len(self.clients)), key=lambda i: (self.inflight[i], self.sessions[i], i))

    def pick(self, key: Hashable) -> int:
        """The replica index for session ``key`` (assigned on first use)."""
        idx = self._sticky.get(key)
        if idx is None:
            idx = self.least_loaded()
            self._sticky[key] = idx
            self.sessions[idx] += 1
        return idx

    @asynccontextmanager
    async def busy(self, idx: int) -> AsyncIterator[Any]:
        """Count a request against replica ``idx`` and wait for one of its send slots."""
        if self._gates is None:
            self._gates = [asyncio.Semaphore(self.max_inflight) for _ in self.clients]
        self.inflight[idx] += 1
        self.served[idx] += 1
        try:
            async with self._gates[idx]:
                yield self.clients[idx]
        finally:
            self.inflight[idx] -= 1

    def take_served(self) -> list[int]:
        """Requests each replica received since the last call (then counting restarts)."""
        served, self.served = self.served, [0] * len(self.clients)
        return served

    def release(self, key: Hashable) -> None:
        idx = self._sticky.pop(key, None)
        if idx is not None:
            self.sessions[idx] -= 1

    # ---- the pool as an engine client ----------------------------------------------------
    async def agenerate(self, input_ids: Sequence[int], sampling_params: dict[str, Any] | None = None,
                        rid: str | None = None) -> Any:
        """``/generate`` on the least-loaded replica."""
        async with self.busy(self.least_loaded()) as client:
            return await client.agenerate(input_ids, sampling_params, rid=rid)

    async def aabort(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        """Abort ``rid`` (or everything) on every replica: the pool does not track which one runs it."""
        await asyncio.gather(*(c.aabort(rid, abort_all=abort_all) for c in self.clients))

    def abort_all(self) -> None:
        """Abort every in-flight generation on every replica (partial rollout at a step end)."""
        for client in self.clients:
            client.abort(abort_all=True)
