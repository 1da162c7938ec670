"""The reward's generic keys: ``timeout_s`` and ``on_error`` in any ``data_sources[i].reward``
node next to the reward's own parameters, defaulting to the ``reward`` section; the
``budgets`` section; every error names its key."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from omegaconf import OmegaConf

from loongsage import hookimpl
from loongsage.config.compose import load_config
from loongsage.config.validate import validate_config
from loongsage.errors import ConfigError
from loongsage.plugins import load_plugins
from loongsage.schema import RewardOptions

RECIPE = "tiny/grpo"


def test_a_source_overrides_the_run_wide_defaults_and_the_plugin_params_stay_its_own():
    run = load_config(RECIPE, ["reward.timeout_s=7", "reward.on_error=drop_group",
                               "+data_sources.0.reward.timeout_s=3"])
    (source,) = run.sources
    assert source.reward.options == RewardOptions(timeout_s=3.0, on_error="drop_group")
    assert source.reward.params.format_score == 0.5 and not hasattr(source.reward.params, "timeout_s")
    node = run.cfg.data_sources[0].reward  # written back: `config show` prints them
    assert (node.timeout_s, node.on_error, node.format_score) == (3.0, "drop_group", 0.5)
    assert source.load_budget.seconds == 600.0 and source.get_budget.key == "budgets.dataset_get_s"


def test_defaults():
    (source,) = load_config(RECIPE, []).sources
    assert source.reward.options == RewardOptions(timeout_s=30.0, on_error="zero")


@pytest.mark.parametrize("overrides, message", [
    (["+data_sources.0.reward.on_error=skip"],
     "data_sources[0].reward.on_error: expected one of zero, drop_group, fail, got 'skip'"),
    (["reward.on_error=drop_grop"], "reward.on_error: expected one of zero, drop_group, fail, got 'drop_grop'; "
                               "did you mean 'drop_group'?"),
    (["+data_sources.0.reward.timeout_s=0"], "data_sources[0].reward.timeout_s: expected a positive number of seconds, got 0.0"),
    (["+data_sources.0.reward.timeout_s=soon"], "data_sources[0].reward.timeout_s: invalid parameter for reward 'math'"),
    (["reward.workers=-1"], "reward.workers: expected >= 0 (0 = one per available core), got -1"),
    (["budgets.filter_s=0"], "budgets.filter_s: expected a positive number of seconds, got 0.0"),
])
def test_bad_values_name_their_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(RECIPE, overrides)
    assert str(err.value).startswith(message)


@dataclass
class ClashingParams:
    timeout_s: float = 1.0


class ClashingReward:
    @staticmethod
    @hookimpl
    def loongsage_register_rewards(register):
        register("clashing", lambda text, truth, params, **context: 0.0, params=ClashingParams)


def test_a_reward_may_not_declare_a_generic_key_as_its_own_parameter():
    registries = load_plugins(extra=[(ClashingReward, "clashing-reward")])
    cfg = OmegaConf.create({"model": {"path": "unused"}, "data_sources": [
        {"name": "c", "dataset": {"format": "synthetic_math"}, "reward": "clashing"}]})
    with pytest.raises(ConfigError) as err:
        validate_config(cfg, registries)
    assert str(err.value).startswith(
        "data_sources[0].reward: reward 'clashing' of distribution 'clashing-reward' declares parameter(s) "
        "['timeout_s'], which every reward node reserves for the core (on_error, timeout_s)")
