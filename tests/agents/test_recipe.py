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


def test_partial_rollout_is_refused_for_router_agents_only():
    import pytest

    from loongsage.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^data_sources\[0\]\.agent: agent 'tool_loop' cannot "
                                          r"continue a sample aborted"):
        load_config("tiny/tool_calculator", ["rollout.partial=true"])
    cfg, _ = load_config("tiny/grpo", ["rollout.partial=true"])  # single_turn continues samples
    assert cfg.rollout.partial
