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
        assert saved["0"]["error"] == "agent: ValueError: trajectory 0 failed"
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


class FailingModelCalls(RouterAgentBase):
    """Every trajectory calls the model through the router; trajectory 0 then fails as
    ``how`` says: its second call times out in the openai SDK (a turn slower than the client's
    timeout), its first one does, or the router refuses it (HTTP 400: ``n`` > 1)."""

    def __init__(self, context, how):
        super().__init__(None, context)
        self.how = how

    async def run_trajectory(self, prompt, urls, key, sampling_params) -> Outcome:
        import httpx
        import openai

        from loongsage_agents.agents.chat import openai_client

        first = key.split(":")[0].endswith("-0")
        timeout = openai.APITimeoutError(request=httpx.Request("POST", urls["openai"] + "/chat/completions"))
        async with openai_client(urls, key) as client:
            if first and self.how == "first_call":
                raise timeout
            extra = {"n": 2} if first and self.how == "refused" else {}
            reply = await client.chat.completions.create(model="policy", messages=prompt.messages,
                                                         max_tokens=8, **extra)
            if first:
                raise timeout
        return Outcome(text=reply.choices[0].message.content)


@pytest.mark.parametrize("how", ["second_call", "first_call"])
def test_a_model_call_that_times_out_fails_its_trajectory_not_the_group(
        how, scripted_engine, agent_context, recording_router, tmp_path):
    """An SDK timeout (or lost connection) on an agent's call to the router is that
    trajectory's failure, handed to ``rollout.failed_trajectory`` with the turns it recorded
    (one marked sample when it failed on its first call) and saved as failed; the group and the
    run go on. It used to propagate and end the run."""
    import json

    agent = FailingModelCalls(agent_context(), how)
    recording_router(agent, scripted_engine(["a", "b", "c"]), tmp_path)
    prompt = Prompt("p", 0, [{"role": "user", "content": "x"}])
    samples = asyncio.run(agent.run_group(prompt, 3, None, {}))
    by_trajectory = {s.reward_info["trajectory_id"][-1]: s for s in samples}
    assert sorted(by_trajectory) == ["0", "1", "2"]
    failed = by_trajectory["0"]
    assert failed.reward_info["failed"] == "a model call failed: APITimeoutError: Request timed out."
    assert bool(failed.response_ids) == (how == "second_call")
    assert not failed.reward_info.get("died_before_model_call")
    for i in "12":
        assert by_trajectory[i].text in {"a", "b", "c"} and "failed" not in by_trajectory[i].reward_info
    saved = {row["trajectory_id"][-1]: row for row in
             map(json.loads, (tmp_path / "trajectories.jsonl").read_text().splitlines())}
    assert saved["0"]["status"] == "failed" and saved["0"]["error"] == failed.reward_info["failed"]
    assert saved["1"]["status"] == saved["2"]["status"] == "finished"


def test_a_request_the_router_refuses_is_the_agents_error_and_ends_the_group(
        scripted_engine, agent_context):
    """A 4xx from the router is a malformed request, the agent's bug: it is not trained as a
    failed trajectory with reward 0 but ends the group (and the run)."""
    import openai

    agent = FailingModelCalls(agent_context(), "refused")
    prompt = Prompt("p", 0, [{"role": "user", "content": "x"}])
    try:
        with pytest.raises(openai.BadRequestError, match="only n=1 is supported"):
            asyncio.run(agent.run_group(prompt, 3, scripted_engine(["a", "b", "c"]), {}))
    finally:
        agent.close()
