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


class TimesOutAfterOneTurn(RouterAgentBase):
    """Every trajectory makes one real model call through the router; trajectory 0's second
    call then times out in the openai SDK, as a turn slower than the client's timeout does."""

    async def run_trajectory(self, prompt, urls, key, sampling_params) -> Outcome:
        import httpx
        import openai

        from loongsage_agents.agents.chat import openai_client

        async with openai_client(urls, key) as client:
            reply = await client.chat.completions.create(model="policy", messages=prompt.messages,
                                                         max_tokens=8)
            if key.split(":")[0].endswith("-0"):
                raise openai.APITimeoutError(request=httpx.Request("POST", urls["openai"]))
        return Outcome(text=reply.choices[0].message.content)


def test_a_model_call_that_times_out_fails_its_trajectory_not_the_group(scripted_engine, agent_context):
    """An SDK timeout (or lost connection) on an agent's call to the router is that
    trajectory's failure, handed to ``rollout.failed_trajectory`` with the turns it recorded;
    the group and the run go on. It used to propagate and end the run."""
    agent = TimesOutAfterOneTurn(None, agent_context())
    prompt = Prompt("p", 0, [{"role": "user", "content": "x"}])
    try:
        samples = asyncio.run(agent.run_group(prompt, 3, scripted_engine(["a", "b", "c"]), {}))
    finally:
        agent.close()
    by_trajectory = {s.reward_info["trajectory_id"][-1]: s for s in samples}
    assert sorted(by_trajectory) == ["0", "1", "2"] and all(s.response_ids for s in samples)
    assert by_trajectory["0"].reward_info["failed"] == "a model call failed: APITimeoutError: Request timed out."
    for i in "12":
        assert by_trajectory[i].text in {"a", "b", "c"} and "failed" not in by_trajectory[i].reward_info
