"""The controller's routers for router-based agents: one per data source over the run's engine
pool, built with the run's settings plus the agent's own, persisting each finished trajectory
(and, once scored, its reward) to the run directory. A scripted engine stands in for the
rollout engine (the reply text is fixed so the persisted tokens can be checked); router,
agent and files are real."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx
import pytest

from loongsage.agentflow.settings import RouterSettings
from loongsage.controller.agent_routers import AgentRouters
from loongsage.data.types import Prompt
from loongsage.engines.pool import EnginePool

from loongsage_agents.agents.chat import ChatAgent
from loongsage_agents.agents.router_params import ChatParams
from loongsage_agents.agents.single_turn import SingleTurnAgent


class SlowEngine:
    """A scripted engine whose replies take a moment, so concurrent trajectories overlap."""

    def __init__(self, engine):
        self.engine, self.sampling_seen = engine, engine.sampling_seen

    async def agenerate(self, *args, **kwargs):
        await asyncio.sleep(0.3)
        return await self.engine.agenerate(*args, **kwargs)

    def astream_generate(self, *args, **kwargs):
        return self.engine.astream_generate(*args, **kwargs)

    async def aabort(self, *args, **kwargs):
        return None


def test_each_router_agent_gets_a_router_that_persists_its_trajectories(scripted_engine, tokenizer,
                                                                         agent_context, tmp_path):
    engines = [SlowEngine(scripted_engine(["Four."] * 2)) for _ in range(2)]
    agent = ChatAgent(ChatParams(), agent_context())
    sources = {"chat_src": SimpleNamespace(agent=agent),
               "plain_src": SimpleNamespace(agent=SingleTurnAgent(None, agent_context()))}
    routers = AgentRouters(sources, EnginePool(engines), tokenizer, RouterSettings(), tmp_path)
    try:
        assert list(routers.urls()) == ["chat_src"]  # single_turn talks to the engine itself
        url = routers.urls()["chat_src"]
        prompt = Prompt("chat_src", 4, [{"role": "user", "content": "2 + 2?"}])
        samples = asyncio.run(agent.run_group(prompt, 2, engines[0], {"temperature": 1.0}))
        assert httpx.get(url + "/health").status_code == 200
        for s in samples:
            s.reward = 0.5 + samples.index(s)
            s.reward_info["correct"] = True
        routers.record_rewards("chat_src", samples)
    finally:
        routers.close()
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health", timeout=2)
    # the two trajectories went to the two replicas (least-loaded), not both to the one passed
    assert [len(e.sampling_seen) for e in engines] == [1, 1]
    lines = (tmp_path / "trajectories" / "chat_src" / "trajectories.jsonl").read_text().splitlines()
    stored = {row["trajectory_id"]: row for row in map(json.loads, lines)}
    assert len(stored) == 2
    for s in samples:
        row = stored[s.reward_info["trajectory_id"]]
        assert row["status"] == "finished"
        assert row["tokens"] == s.prompt_ids + s.response_ids
        assert row["loss_mask"] == [0] * len(s.prompt_ids) + s.loss_mask
        assert tokenizer.decode(s.response_ids) == "Four.<|im_end|>"
    rewards = [json.loads(line) for line in
               (tmp_path / "trajectories" / "chat_src" / "rewards.jsonl").read_text().splitlines()]
    assert sorted((r["trajectory_id"], r["reward"], r["info"]["correct"]) for r in rewards) == \
        sorted((s.reward_info["trajectory_id"], s.reward, True) for s in samples)
    assert all("messages" not in r["info"] for r in rewards)  # numeric fields only


def test_an_agent_adds_its_own_middlewares_resolved_after_the_runs(agent_context):
    """``router_settings(base)``: the run's resolved chain and tool parser, then the agent's own
    middlewares, which the agent resolves (the router looks nothing up); OpenCode's override
    takes the run's settings too and adds its title model."""
    from loongsage.config.router_plugins import resolve_router_plugins
    from loongsage.errors import UnknownPluginError
    from loongsage.plugins import get_registries

    from loongsage_agents.agents.router_params import OpenCodeParams
    from loongsage_agents.launchers.opencode import OpenCodeAgent

    base = RouterSettings().with_plugins(resolve_router_plugins(get_registries(), "qwen3_xml", ["tool_call_parser"]))
    for agent in (ChatAgent(ChatParams(), agent_context()), OpenCodeAgent(OpenCodeParams(), agent_context())):
        settings = agent.router_settings(base)
        assert [m.name for m in settings.middlewares] == ["tool_call_parser", "agent_sessions"]
        assert settings.tool_parser.name == "qwen3_xml"
    assert settings.untrained_models == ["policy-title"]
    private = ChatAgent(ChatParams(), agent_context()).router_settings()  # no run: the config's defaults
    assert ([m.name for m in private.middlewares], private.tool_parser.name) == (["agent_sessions"], "hermes")
    with pytest.raises(UnknownPluginError, match=r"data_sources\[0\].agent.middlewares\[0\]: unknown router_middleware "
                                                 r"'agent_sesions'"):
        ChatAgent(ChatParams(middlewares=["agent_sesions"]), agent_context()).router_settings(base)
