"""Structured concurrency for an agent's parallel work (a group's trajectories or requests).

``asyncio.gather`` gives up at the first failed or cancelled task and leaves its siblings
running. An agent's siblings hold sandboxes, subprocesses and router trajectories, so a group
must not report before they have unwound: otherwise they outlive it, and at the end of an
async run they outlive the event loop (pending tasks destroyed, pipes closed by the garbage
collector after the loop is gone).
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence


async def gather_all(tasks: Sequence["asyncio.Future[Any]"]) -> list[Any]:
    """Every task's result, in order; on a failure or cancellation, cancel the others, wait
    until all of them have finished unwinding, then re-raise. A task already being cancelled is
    left to finish its cleanup rather than interrupted again."""
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            if not task.done() and not task.cancelling():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
