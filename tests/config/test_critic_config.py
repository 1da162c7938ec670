"""``algorithm.critic`` and one sample per prompt: what validation accepts and refuses, each
refusal naming the key and the reason."""

from __future__ import annotations

import pytest

from loongsage.config.compose import load_config
from loongsage.errors import ConfigError


def refused(*overrides: str, recipe: str = "tiny/ppo") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(recipe, list(overrides))
    return info.value


def test_ppo_recipe_resolves_a_critic_and_grpo_has_none():
    ppo = load_config("tiny/ppo").algorithm
    assert ppo.advantage.name == "gae" and ppo.advantage.params.lam == 1.0
    assert ppo.critic.engine.name == "embedded_critic"
    assert ppo.critic.settings.warmup_steps == 2 and ppo.critic.settings.lr == 1e-4
    assert load_config("tiny/grpo").algorithm.critic is None


@pytest.mark.parametrize("key,value", [("lr", 0), ("value_clip", -0.1), ("warmup_steps", -1),
                                       ("updates_per_step", 0)])
def test_critic_numbers_out_of_range_name_their_key(key, value):
    error = refused(f"algorithm.critic.{key}={value}")
    assert error.key == f"algorithm.critic.{key}"


def test_critic_with_a_kl_reward_penalty_is_refused():
    error = refused("algorithm.kl.coef=0.1", "algorithm.kl.use_as=reward")
    assert error.key == "algorithm.kl.use_as" and "critic" in str(error)


@pytest.mark.parametrize("estimator", [
    "algorithm/advantage_estimator=grpo", "algorithm/advantage_estimator=rloo",
    "algorithm/advantage_estimator=dr_grpo", "algorithm/advantage_estimator=reinforce_plus_plus_baseline"])
def test_a_group_baseline_with_groups_of_one_is_refused(estimator):
    error = refused(estimator, "rollout.n_samples_per_prompt=1", recipe="tiny/grpo")
    assert error.key == "rollout.n_samples_per_prompt"
    assert "every advantage is 0" in str(error) and "critic" in str(error)


@pytest.mark.parametrize("recipe,overrides", [
    ("tiny/ppo", []),  # the critic gives the baseline
    ("tiny/grpo", ["algorithm.advantage_estimator.norm_mode=batch_zscore"]),  # a batch baseline
    ("tiny/grpo", ["algorithm/advantage_estimator=reinforce_plus_plus"]),
])
def test_one_sample_per_prompt_is_allowed_with_a_baseline_beyond_the_group(recipe, overrides):
    run = load_config(recipe, [*overrides, "rollout.n_samples_per_prompt=1"])
    assert run.cfg.rollout.n_samples_per_prompt == 1
