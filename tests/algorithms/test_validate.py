"""``validate_algorithm``: every rejection names the key and the reason."""

import pytest
from omegaconf import OmegaConf

from loongsage.algorithms.validate import validate_algorithm
from loongsage.schema import AlgorithmConfig
from loongsage.errors import ConfigError, UnknownPluginError
from loongsage.plugins import get_registries


def _check(cfg, key, reason):
    with pytest.raises(ConfigError) as info:
        validate_algorithm(cfg, get_registries())
    assert info.value.key == key
    assert reason in info.value.problem


def test_schema_defaults_are_valid():
    spec = validate_algorithm(OmegaConf.structured(AlgorithmConfig), get_registries())
    assert (spec.advantage.name, spec.policy_loss.name, spec.kl_method) == ("grpo", "ppo_clip", "k3")
    assert spec.corrections == () and not spec.needs_reference


def test_bad_values_name_their_key():
    _check({"loss_agg_mode": "token-mean"}, "algorithm.loss_agg_mode", "seq_mean_token_mean")
    _check({"kl": {"use_as": "penalty"}}, "algorithm.kl.use_as", "loss")
    _check({"kl": {"coef": -1}}, "algorithm.kl.coef", ">= 0")
    _check({"loss_agg_norm_len": 0}, "algorithm.loss_agg_norm_len", "> 0")
    _check({"policy_loss": {"name": "ppo_clip", "dual_clip": 0.5}}, "algorithm.policy_loss", "dual_clip must be > 1")
    _check({"policy_loss": {"name": "ppo_clip", "eps_hi": 0.3}}, "algorithm.policy_loss.eps_hi", "ppo_clip")
    _check({"advantage_estimator": {"name": "grpo", "norm_mode": "zscore"}},
           "algorithm.advantage_estimator", "norm_mode")
    _check({"policy_loss": {"nme": "ppo_clip"}}, "algorithm.policy_loss", "expected a policy_loss name or a mapping with 'name'")


def test_unknown_names_suggest_the_closest():
    with pytest.raises(UnknownPluginError) as info:
        validate_algorithm({"policy_loss": {"name": "ppo_clp"}}, get_registries())
    assert info.value.key == "algorithm.policy_loss.name" and info.value.closest == "ppo_clip"
    with pytest.raises(UnknownPluginError) as info:
        validate_algorithm({"kl": {"method": "k4"}}, get_registries())
    assert info.value.key == "algorithm.kl.method"


def test_plain_names_and_dictconfig_are_accepted():
    spec = validate_algorithm(OmegaConf.create({"policy_loss": "ppo_clip", "kl": {"method": "k3_st"}}),
                              get_registries())
    assert spec.policy_loss.params.eps_high == 0.28 and spec.kl_method == "k3_st"


def test_recipe_overrides_go_through_the_config_validator():
    """The config validator resolves the algorithm section and applies these rules."""
    from loongsage.config.compose import load_config

    run = load_config("tiny/grpo", ["algorithm/policy_loss=m2po", "algorithm.is_correction=[opsm]"])
    assert run.cfg.algorithm.is_correction[0]["delta"] == 0.1 == run.algorithm.corrections[0].params.delta
    run = load_config("tiny/grpo", ["algorithm.is_correction=[opsm,{name:token,upper:3.0}]"])
    assert [c["name"] for c in run.cfg.algorithm.is_correction] == ["opsm", "token"]
    assert [c.name for c in run.algorithm.corrections] == ["opsm", "token"]
    with pytest.raises(ConfigError) as info:
        load_config("tiny/grpo", ["algorithm/policy_loss=m2po", "algorithm.is_correction=token"])
    assert info.value.key == "algorithm.is_correction" and "corrected twice" in info.value.problem
