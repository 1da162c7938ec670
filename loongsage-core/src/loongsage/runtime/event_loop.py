"""The run's one rollout event loop, on a daemon thread, driven from synchronous code.

Every rollout coroutine of a run (agent loops, engine requests, reward calls, the
asynchronous scheduler's bookkeeping) runs on this one loop, whichever scheduler is in use:
the synchronous scheduler submits a step's groups and waits for them, the asynchronous one
keeps dispatching between steps. The controller's thread only blocks in ``run`` (or on the
future ``submit`` returns).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any, Awaitable


class EventLoopThread:
    """An asyncio loop running forever on a daemon thread until ``close()``."""

    def __init__(self, name: str = "loongsage-rollout") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, coro: Awaitable[Any]) -> Future:
        """Schedule ``coro`` on the loop; return a thread-safe future of its result."""
        if self._closed:
            raise RuntimeError("the rollout event loop is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Awaitable[Any]) -> Any:
        """Run ``coro`` on the loop and block until it returns (or raises)."""
        return self.submit(coro).result()

    def in_loop(self) -> bool:
        """Whether the caller runs on the loop's own thread."""
        return threading.current_thread() is self._thread

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop (after what is scheduled now has run) and join its thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=timeout)
        if not self._thread.is_alive():
            self.loop.close()
