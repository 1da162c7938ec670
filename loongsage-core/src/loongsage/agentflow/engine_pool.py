"""Engine replicas behind the router: sticky per trajectory, least-loaded for new ones.

A trajectory keeps its replica for its whole life (the replica's prefix cache holds its
tokens). A new trajectory goes to the replica with the fewest in-flight requests, ties
broken by the fewest sticky trajectories, then by index.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Hashable, Iterator


class EnginePool:
    def __init__(self, clients: list[Any]) -> None:
        if not clients:
            raise ValueError("agentflow: the router needs at least one engine replica")
        self.clients = list(clients)
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

    @contextmanager
    def busy(self, idx: int) -> Iterator[Any]:
        self.inflight[idx] += 1
        try:
            yield self.clients[idx]
        finally:
            self.inflight[idx] -= 1

    def release(self, key: Hashable) -> None:
        idx = self._sticky.pop(key, None)
        if idx is not None:
            self.sessions[idx] -= 1
