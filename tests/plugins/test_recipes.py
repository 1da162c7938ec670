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
    cfg, registries = load_config(recipe)
    alg = cfg.algorithm
    named = [
        ("advantage", alg.advantage_estimator.name),
        ("policy_loss", alg.policy_loss.name),
        ("kl_policy", alg.kl.method),
        ("window_policy", cfg["async"].window_policy.name),
        ("engine", cfg.train.backend),
        ("engine", cfg.rollout.backend),
        ("tool_parser", cfg.agentflow.tool_parser),
        *[("tracker", t.name) for t in cfg.logging.trackers],
        *[("data_filter", f.name) for f in alg.filters],
    ]
    if alg.is_correction is not None:
        named.append(("is_correction", alg.is_correction.name))
    for source in cfg.data_sources:
        named += [
            ("dataset", source.dataset.format),
            ("agent", source.agent.name),
            ("reward", source.reward.name),
            *[("data_filter", f.name) for f in source.filters],
        ]
        if source.sandbox is not None:
            named.append(("sandbox", source.sandbox.type))
    for kind, name in named:
        assert kind in KINDS
        registries[kind].entry(name)  # raises UnknownPluginError if not registered
