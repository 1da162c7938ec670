"""``algorithm.critic`` (loongsage-algos' step term ``critic``) and one sample per prompt: what
validation accepts and refuses, each refusal naming the key and the reason."""

from __future__ import annotations

import pytest

from loongsage import catalogue
from loongsage.config.compose import load_config
from loongsage.errors import ConfigError
from loongsage.plugins import clear_cache


def refused(*overrides: str, recipe: str = "tiny/ppo") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(recipe, list(overrides))
    return info.value


def critic_of(run):
    """The run's critic (loongsage-algos' step term of ``algorithm.critic``), or None."""
    return next((term.settings for term in run.step_terms if term.section == "algorithm.critic"), None)


def test_ppo_recipe_resolves_a_critic_and_grpo_has_none():
    run = load_config("tiny/ppo")
    ppo, critic = run.algorithm, critic_of(run)
    assert ppo.advantage.name == "gae" and ppo.advantage.params.lam == 1.0
    assert critic.engine.name == "embedded_critic"
    assert critic.settings.warmup_steps == 2 and critic.settings.lr == 1e-4
    assert critic_of(load_config("tiny/grpo")) is None


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
    assert "every advantage is 0" in str(error) and "value model" in str(error)


@pytest.mark.parametrize("recipe,overrides", [
    ("tiny/ppo", []),  # the critic gives the baseline
    ("tiny/grpo", ["algorithm.advantage_estimator.norm_mode=batch_zscore"]),  # a batch baseline
    ("tiny/grpo", ["algorithm/advantage_estimator=reinforce_plus_plus"]),
])
def test_one_sample_per_prompt_is_allowed_with_a_baseline_beyond_the_group(recipe, overrides):
    run = load_config(recipe, [*overrides, "rollout.n_samples_per_prompt=1"])
    assert run.cfg.rollout.n_samples_per_prompt == 1


def test_the_critic_section_is_typed_inside_algorithm():
    """``algorithm.critic`` is the step term's section, nested in core's ``algorithm``: its keys
    are type-checked like core's, with the closest key for a misspelt one."""
    error = refused("algorithm.critic.lrr=1e-4")
    assert error.key == "algorithm.critic.lrr" and "did you mean algorithm.critic.lr?" in str(error)
    assert critic_of(load_config("tiny/ppo", ["algorithm.critic.value_clip=0.2"])).settings.value_clip == 0.2


def test_without_loongsage_algos_gae_and_the_critic_section_are_refused_with_the_install(monkeypatch):
    """Without loongsage-algos (left unloaded by the allow-list; the installed check is faked)
    no step term supplies ``values``, so ``gae`` is refused at load naming the estimator and the
    install that brings its critic, and a recipe setting ``algorithm.critic`` is refused naming
    the section and the install, before Hydra's key error."""
    monkeypatch.setenv("LOONGSAGE_LOAD_PLUGINS", "loongsage_agents")
    monkeypatch.setattr(catalogue, "is_installed", lambda distribution: distribution != "loongsage-algos")
    clear_cache()
    try:
        error = refused("algorithm/advantage_estimator=gae", recipe="tiny/grpo")
        section = refused()
        override = refused("algorithm.critic.lr=1e-4", recipe="tiny/grpo")
        run = load_config("tiny/grpo")
    finally:
        clear_cache()
    assert error.key == "algorithm.advantage_estimator"
    assert "'gae' reads per-token values" in str(error) and "pip install loongsage-algos" in str(error)
    assert section.key == override.key == "algorithm.critic"
    assert str(section).startswith("algorithm.critic: unknown section: it belongs to step term 'critic'.")
    assert str(section).endswith("'critic' (step_term) comes with loongsage-algos, which is not installed; in a "
                                 "clone of LoongSage: make wheels && pip install dist/loongsage_algos-*.whl")
    assert run.step_terms == () and "critic" not in run.cfg.algorithm


def test_distillation_and_a_critic_are_active_in_one_run():
    """Two step terms in one run: the critic adds no loss term, so it combines with ``opd``'s."""
    run = load_config("tiny/mopd", ["opd.teachers.0.path=builtin:tiny", "opd.teachers.1.path=builtin:tiny",
                                    "algorithm/advantage_estimator=gae", "algorithm.critic.warmup_steps=1"])
    assert sorted(term.section for term in run.step_terms) == ["algorithm.critic", "opd"]
    assert [term.section for term in run.step_terms if term.has_train_term] == ["opd"]
    assert critic_of(run).settings.warmup_steps == 1
