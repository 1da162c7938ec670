"""The AgentFlow recipe composes and validates, and its agent is built from the registry with
the recipe's typed parameters (the training run itself is exercised by `loongsage train`)."""

from __future__ import annotations

import pytest

from loongsage import hookimpl
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


class _OneShotAgent:
    """An agent with neither continue_sample nor a router behind its turns."""

    def __init__(self, params, context):
        pass

    async def run_group(self, prompt, n, client, sampling_params):
        return []


class _OneShotPlugin:
    @staticmethod
    @hookimpl
    def loongsage_register_agents(register):
        register("one_shot", _OneShotAgent)


@pytest.mark.calls_hook("loongsage_register_agents")
def test_partial_rollout_is_accepted_for_router_agents_and_refused_for_agents_with_neither_path():
    from loongsage.errors import ConfigError

    run = load_config("tiny/tool_calculator", ["rollout.partial=true"])  # the router continues turns
    assert run.cfg.rollout.partial and run.sources[0].agent.obj.continues_turns_in_place
    run = load_config("tiny/grpo", ["rollout.partial=true"])  # single_turn continues samples
    assert run.cfg.rollout.partial
    with pytest.raises(ConfigError, match=r"^data_sources\[0\]\.agent: agent 'one_shot' cannot "
                                          r"continue a sample aborted at a weight update"):
        load_config("tiny/grpo", ["rollout.partial=true", "data_sources.0.agent.name=one_shot"],
                    extra_plugins=[(_OneShotPlugin, "one-shot-agent")])
