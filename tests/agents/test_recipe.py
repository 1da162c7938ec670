"""The AgentFlow recipe composes and validates, and its agent is built from the registry with
the recipe's typed parameters (the training run itself is exercised by `loongsage train`)."""

from __future__ import annotations

from loongsage.config.compose import load_config

from loongsage_agents.agents.router_params import ToolLoopParams
from loongsage_agents.agents.tool_loop import ToolLoopAgent


def test_tool_calculator_recipe_builds_a_tool_loop_agent():
    cfg, registries = load_config("tiny/tool_calculator", ["trainer.steps=1"])
    ref = dict(cfg.data_sources[0].agent)
    entry = registries.agent.entry(ref.pop("name"), key="data_sources[0].agent")
    params = entry.build_params(ref, key="data_sources[0].agent")
    assert isinstance(params, ToolLoopParams)
    assert (params.sandbox, params.tools, params.max_turns) == ("bwrap", ["calculator"], 3)
    agent = entry.obj(params, None)
    assert isinstance(agent, ToolLoopAgent) and list(agent.tools) == ["calculator"]
