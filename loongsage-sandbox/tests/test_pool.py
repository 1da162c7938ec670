"""The pool: pre-warming, one sandbox per trajectory, reset between trajectories, replacement."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from loongsage.plugin import ConfigError
from loongsage.plugin.testing import installed_registries
from loongsage_sandbox.pool import SandboxPool
from loongsage_sandbox.testing import bwrap_unavailable_reason

BACKEND = "bwrap" if bwrap_unavailable_reason() is None else "process"
PARAMS = {} if BACKEND == "bwrap" else {"allow_untrusted_code": True}


def run(coro):
    return asyncio.run(coro)


def pool(**kwargs):
    """Built from the registered class, the way sibling packages get a pool without importing us."""
    made = installed_registries().sandbox.get(BACKEND).pool(PARAMS, files={"task.txt": "spec"}, **kwargs)
    assert isinstance(made, SandboxPool)
    return made


def test_prewarm_per_trajectory_reuse_and_reset():
    async def go():
        async with pool(size=2, max_size=2) as p:
            warmed = (p.stats.created, p.idle)
            a = await p.acquire("traj-a")
            again = await p.acquire("traj-a")
            b = await p.acquire("traj-b")
            await a.exec("echo from-a > note.txt")
            seen_by_a = (await a.exec("cat note.txt task.txt")).text
            await p.release("traj-a")
            c = await p.acquire("traj-c")  # gets a's sandbox back, reset
            seen_by_c = (await c.exec("ls")).text
            await p.release("traj-b")
            await p.release("traj-c")
            return warmed, a is again, a is c, b is not a, seen_by_a, seen_by_c, p.stats

    warmed, same, reused, distinct, seen_by_a, seen_by_c, stats = run(go())
    assert warmed == (2, 2)
    assert same and reused and distinct
    assert seen_by_a == "from-a\nspec"
    assert seen_by_c == "task.txt\n"  # a's note is gone, the initial file is back
    assert (stats.created, stats.lent, stats.resets, stats.reused) == (2, 3, 3, 3)


def test_acquire_waits_at_max_size_and_sessions_release_on_error():
    async def go():
        async with pool(size=1, max_size=1) as p:
            order = []

            async def user(tid, hold):
                async with p.session(tid) as sb:
                    order.append(f"{tid} in")
                    await asyncio.sleep(hold)
                    order.append(f"{tid} out")
                    if tid == "t1":
                        raise ValueError("trajectory failed")
                    return (await sb.exec("echo ok")).text

            results = await asyncio.gather(user("t1", 0.2), user("t2", 0.0), return_exceptions=True)
            return order, results, p.stats.created

    order, results, created = run(go())
    assert order == ["t1 in", "t1 out", "t2 in", "t2 out"]  # one sandbox: t2 waited for t1
    assert isinstance(results[0], ValueError) and results[1] == "ok\n"
    assert created == 1


def test_a_crashed_sandbox_is_replaced_not_lent_again():
    async def go():
        async with pool(size=1, max_size=1) as p:
            bad = await p.acquire("t1")
            os.killpg(bad._proc.pid, signal.SIGKILL)
            with pytest.raises(Exception):
                await bad.exec("true")
            await p.release("t1")
            good = await p.acquire("t2")
            out = (await good.exec("echo alive")).text
            return bad is good, out, p.stats.replaced, p.stats.created

    same, out, replaced, created = run(go())
    assert not same and out == "alive\n"
    assert (replaced, created) == (1, 2)


def test_pool_rejects_bad_sizes_and_parameters():
    cls = installed_registries().sandbox.get(BACKEND)
    with pytest.raises(ConfigError, match=r"pool\.size"):
        SandboxPool(cls, PARAMS, size=-1)
    with pytest.raises(ConfigError, match=r"pool\.max_size"):
        SandboxPool(cls, PARAMS, size=3, max_size=2)
    with pytest.raises(ConfigError, match=r"sandbox\.disk_mb"):
        SandboxPool(cls, {**PARAMS, "disk_mb": 0})
