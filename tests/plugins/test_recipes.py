"""Every bundled recipe composes, validates, and names only registered plugins."""

from __future__ import annotations

import pytest

from loongsage.config.compose import list_recipes, load_config
from loongsage.registry import KINDS

RECIPES = list_recipes()


def test_recipes_exist():
    assert {"tiny/grpo", "smollm2/grpo"} <= set(RECIPES)


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_composes_and_resolves_every_plugin(recipe):
    run = load_config(recipe)
    cfg, alg = run.cfg, run.algorithm
    resolved = [
        (alg.advantage, cfg.algorithm.advantage_estimator.name),
        (alg.policy_loss, cfg.algorithm.policy_loss.name),
        (alg.kl, cfg.algorithm.kl.method),
        (run.window_policy, cfg["async"].window_policy.name),
        (run.train_engine, cfg.train.backend),
        (run.rollout_engine, cfg.rollout.backend),
        (run.tool_parser, cfg.agentflow.tool_parser),
        *zip(run.trackers, [t.name for t in cfg.logging.trackers]),
        *zip(alg.filters, [f.name for f in cfg.algorithm.filters]),
    ]
    for source, node in zip(run.sources, cfg.data_sources, strict=True):
        resolved += [*zip(source.filters, [f.name for f in node.filters])]
        if node.environment is not None:  # its dataset, agent and reward are bound to it
            resolved.append((source.environment, node.environment.type))
        else:
            resolved += [(source.dataset, node.dataset.format), (source.agent, node.agent.name),
                         (source.reward, node.reward.name)]
        if node.sandbox is not None:
            resolved.append((source.sandbox, node.sandbox.type))
    for ref, name in resolved:  # each named plugin resolved once, to the registered entry of that name
        assert ref.kind in KINDS and ref.name == name
        assert run.registries[ref.kind].entry(name) is ref.entry
