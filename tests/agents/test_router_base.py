"""RouterAgentBase.run_group's structured concurrency: when one trajectory of a group fails
(or the group is cancelled), the others are cancelled and fully unwound (their sandboxes and
trajectories closed) before the group reports. Left running, they outlived the group, and at
the end of an async run outlived the event loop (pending tasks destroyed, pipes closed by GC).
The engine is scripted but never called; the router is real."""

from __future__ import annotations

import asyncio

import pytest

from loongsage.data.types import Prompt

from loongsage_agents.agents.router_base import Outcome, RouterAgentBase


class Flaky(RouterAgentBase):
    """Trajectory 0 fails at once; the others wait, then need a moment to clean up."""

    def __init__(self, context):
        super().__init__(None, context)
        self.cleaned: list[str] = []

    async def run_trajectory(self, prompt, urls, key, sampling_params) -> Outcome:
        if key.split(":")[0].endswith("-0"):
            await asyncio.sleep(0.05)
            raise ValueError("trajectory 0 failed")
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.1)  # e.g. a sandbox being shut down
            self.cleaned.append(key)
        return Outcome()


@pytest.mark.parametrize("how", ["failure", "cancel"])
def test_a_group_reports_only_after_every_trajectory_unwound(how, scripted_engine, agent_context):
    agent = Flaky(agent_context())
    prompt = Prompt("p", 0, [{"role": "user", "content": "x"}])

    async def go():
        group = asyncio.ensure_future(agent.run_group(prompt, 3, scripted_engine([]), {}))
        if how == "cancel":
            await asyncio.sleep(0.02)  # before trajectory 0 fails
            group.cancel()
        with pytest.raises(asyncio.CancelledError if how == "cancel" else ValueError):
            await group
        return len(agent.cleaned), len(asyncio.all_tasks()) - 1

    try:
        cleaned, still_running = asyncio.run(go())
    finally:
        agent.close()
    assert cleaned == 2 and still_running == 0  # trajectory 0 has nothing to clean up


@pytest.mark.parametrize("how", ["failure", "cancel"])
def test_trajectories_of_a_failed_or_cancelled_group_are_saved_as_failed_with_the_reason(
        how, scripted_engine, agent_context, recording_router, tmp_path):
    """A trajectory whose agent program raised or was cancelled is persisted as ``failed``,
    naming why, not as a finished trajectory that merely has no tokens."""
    import json

    agent = Flaky(agent_context())
    recording_router(agent, scripted_engine([]), tmp_path)
    prompt = Prompt("p", 0, [{"role": "user", "content": "x"}])

    async def go():
        group = asyncio.ensure_future(agent.run_group(prompt, 3, None, {}))
        if how == "cancel":
            await asyncio.sleep(0.02)
            group.cancel()
        with pytest.raises(asyncio.CancelledError if how == "cancel" else ValueError):
            await group

    asyncio.run(go())
    saved = {row["trajectory_id"][-1]: row for row in
             map(json.loads, (tmp_path / "trajectories.jsonl").read_text().splitlines())}
    assert sorted(saved) == ["0", "1", "2"] and {row["status"] for row in saved.values()} == {"failed"}
    if how == "failure":
        assert saved["0"]["error"] == "agent: ValueError trajectory 0 failed"
    assert {saved[i]["error"] for i in ("1", "2")} == {"agent: CancelledError"}


def test_a_private_router_over_the_runs_pool_uses_that_pool(scripted_engine, agent_context):
    """Given the run's ``EnginePool``, an agent's private router routes through it, not a pool
    around it: only the run's pool sees the controller's update aborts, so only then are turns
    continued across a weight update (``Router([pool])`` hid them)."""
    from loongsage.engines.pool import EnginePool

    agent = Flaky(agent_context())
    pool, client = EnginePool([scripted_engine([])]), scripted_engine([])
    try:
        assert agent.router_for(pool).pool is pool
        assert agent.router_for(client).pool.clients == [client]
    finally:
        agent.close()
