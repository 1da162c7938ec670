"""The AgentFlow recipe composes and validates, and its agent is built from the registry with
the recipe's typed parameters (the training run itself is exercised by `loongsage train`)."""

from __future__ import annotations

from loongsage.config.compose import load_config
from loongsage.data.sources import build_sources

from loongsage_agents.agents.router_params import ToolLoopParams
from loongsage_agents.agents.tool_loop import ToolLoopAgent


def test_tool_calculator_recipe_builds_a_tool_loop_agent_with_the_sources_sandbox(tokenizer):
    run = load_config("tiny/tool_calculator", ["trainer.steps=1"])
    spec = run.sources[0]
    assert isinstance(spec.agent.params, ToolLoopParams)
    assert (spec.agent.params.tools, spec.agent.params.max_turns) == (["calculator"], 3)
    source = build_sources(run.sources, run.registries, tokenizer=tokenizer)["arithmetic"]
    agent = source.agent
    assert isinstance(agent, ToolLoopAgent) and list(agent.tools) == ["calculator"]
    assert agent.sandbox is source.sandbox and agent.sandbox.ref.name == "bwrap"  # data_sources[0].sandbox


def test_partial_rollout_is_refused_for_router_agents_only():
    import pytest

    from loongsage.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^data_sources\[0\]\.agent: agent 'tool_loop' cannot "
                                          r"continue a sample aborted"):
        load_config("tiny/tool_calculator", ["rollout.partial=true"])
    run = load_config("tiny/grpo", ["rollout.partial=true"])  # single_turn continues samples
    assert run.cfg.rollout.partial
