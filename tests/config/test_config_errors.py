"""Config errors that never mislead: each names the key, the reason and the fix that works.

Every case runs through ``load_config`` and through the real ``loongsage`` command in a
subprocess (``config show`` or ``train``: both fail before anything starts), which must exit
with code 2 and print the same message.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from loongsage import cli
from loongsage.config.compose import load_config
from loongsage.errors import ConfigError, UnknownPluginError

RECIPE = "tiny/grpo"

# (overrides, key the error names, text it must contain, text it must not contain)
CASES = {
    "unknown key": (
        ["trainer.stepz=2"],
        "trainer.stepz",
        "did you mean trainer.steps?",
        "+trainer",
    ),
    "unknown key added with +": (
        ["+rollout.temprature=0.5"],
        "rollout.temprature",
        "did you mean rollout.temperature?",
        "+rollout",
    ),
    "unknown key without +": (
        ["rollout.temprature=0.5"],
        "rollout.temprature",
        "did you mean rollout.temperature?",
        "+rollout",
    ),
    "misspelt section": (
        ["trainr.steps=3"],
        "trainr.steps",
        "did you mean trainer.steps?",
        "+trainr",
    ),
    "unknown top-level key added with +": (
        ["+trainr.steps=3"],
        "trainr.steps",
        "did you mean trainer.steps?",
        None,
    ),
    "wrong type": (
        ["trainer.steps=abc"],
        "trainer.steps",
        "expected an integer, got 'abc'",
        "Error merging",
    ),
    "wrong type of a bool": (
        ["rollout.partial=maybe"],
        "rollout.partial",
        "expected a boolean",
        None,
    ),
    "wrong item type in a list": (
        ["train.betas=[0.9,fast]"],
        "train.betas",
        "expected a number, got 'fast'",
        None,
    ),
    "section replaced by a scalar": (["trainer=3"], "trainer", "expected a mapping, got 3", None),
    "plugins not a list": (["plugins=3"], "plugins", "expected a list of importable module names", None),
    "unknown data source key": (
        ["data_sources.0.weigth=2"],
        "data_sources.0.weigth",
        "did you mean data_sources.0.weight?",
        None,
    ),
    "unknown plugin parameter added with +": (
        ["+algorithm.policy_loss.eps_hih=0.3"],
        "algorithm.policy_loss.eps_hih",
        "did you mean algorithm.policy_loss.eps_high?",
        None,
    ),
    "plugin parameter out of its own range": (
        [
            "algorithm/advantage_estimator=reinforce_plus_plus",
            "algorithm.advantage_estimator.gamma=2",
        ],
        "algorithm.advantage_estimator",
        "gamma must be in (0, 1], got 2.0",
        "Traceback",
    ),
    "misspelt choice": (
        ["placement.mode=colocate"],
        "placement.mode",
        "did you mean 'colocated'?",
        None,
    ),
    "misspelt config group": (
        ["algorithm/policy_los=cispo"],
        "algorithm/policy_los",
        "did you mean algorithm/policy_loss?",
        "+algorithm",
    ),
    "unknown config group with nothing close": (
        ["algorithm/agent=chat"],
        "algorithm/agent",
        "unknown config group 'algorithm/agent'; groups: ",
        "did you mean",
    ),
    "list-entry group cannot be selected": (
        ["data_sources/agent=chat"],
        "data_sources/agent",
        "data_sources.0.agent.name=NAME",
        None,
    ),
    "model-parallel sizes for a backend without them": (
        ["train.megatron.tp=2"],
        "train.megatron",
        "applies to train.backend=megatron only, not 'embedded_train'",
        None,
    ),
}


def _run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "loongsage.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


@pytest.mark.parametrize("case", CASES)
def test_load_config_names_the_key_and_the_fix(case):
    overrides, key, says, never = CASES[case]
    with pytest.raises(ConfigError) as err:
        load_config(RECIPE, overrides)
    assert err.value.key == key
    assert says in str(err.value)
    assert never is None or never not in str(err.value)


@pytest.mark.parametrize("case", CASES)
def test_cli_exits_2_with_the_same_message(case):
    overrides, key, says, never = CASES[case]
    command = "train" if sorted(CASES).index(case) % 2 else "config show"
    result = _run_cli(*command.split(), "--config-name", RECIPE, *overrides)
    assert result.returncode == 2, result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith(f"error: {key}: ") and says in message
    assert never is None or never not in result.stderr


def test_whole_sections_can_still_be_overridden():
    """The listing-only groups live apart, so no section turned into a Hydra group folder."""
    source = "{name: a, dataset: {format: synthetic_math}, reward: {name: math}}"
    cfg = load_config(RECIPE, [f"data_sources=[{source}]", "train={lr: 0.5}"]).cfg
    assert [s.name for s in cfg.data_sources] == ["a"]
    assert cfg.train.lr == 0.5 and cfg.train.backend == "embedded_train"


def test_keys_the_schema_has_need_no_plus():
    """Data sources are typed while composing, so a field a recipe leaves out can be set."""
    cfg = load_config(
        RECIPE, ["data_sources.0.weight=2", "data_sources.0.system_prompt=Be brief."]
    ).cfg
    assert cfg.data_sources[0].weight == 2.0 and cfg.data_sources[0].system_prompt == "Be brief."


def test_plus_still_adds_a_parameter_the_composed_node_lacks():
    """``+`` is right for an open plugin node: the parameter exists, the recipe left it out."""
    cfg = load_config(RECIPE, ["+data_sources.0.dataset.size=50"]).cfg
    assert cfg.data_sources[0].dataset.size == 50
    with pytest.raises(
        ConfigError,
        match=r"data_sources\[0\]\.dataset\.sise: .*did you mean data_sources\[0\]\.dataset\.size\?",
    ):
        load_config(RECIPE, ["+data_sources.0.dataset.sise=50"])


def test_sibling_plugin_that_is_not_loaded_names_its_distribution():
    """loongsage-algos is installed here; the allow-list leaves it out of the loaded plugins."""
    env = {"LOONGSAGE_LOAD_PLUGINS": "loongsage_agents,loongsage_sandbox"}
    result = _run_cli(
        "config", "show", "--config-name", RECIPE, "algorithm/policy_loss=m2po", env=env
    )
    assert result.returncode == 2, result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("error: algorithm.policy_loss: unknown policy_loss 'm2po'.")
    assert message.endswith(
        "'m2po' (policy_loss) comes with loongsage-algos, which is installed but not loaded "
        "(LOONGSAGE_LOAD_PLUGINS does not name it)."
    )
    assert "pip install" not in message


def test_sibling_plugin_that_is_not_installed_says_which_pip_install(monkeypatch, capsys):
    """The test venv has every sibling installed and uninstalling one here would break the other
    tests, so the installed check alone is faked; the plugins really are not loaded (allow-list),
    and the CLI's own ``main`` runs in this process."""
    from loongsage import catalogue
    from loongsage.plugins import clear_cache

    monkeypatch.setenv("LOONGSAGE_LOAD_PLUGINS", "loongsage_algos")
    monkeypatch.setattr(
        catalogue, "is_installed", lambda distribution: distribution != "loongsage-agents"
    )
    clear_cache()
    try:
        with pytest.raises(UnknownPluginError) as err:
            load_config(RECIPE)
        assert cli.main(["train", "--config-name", RECIPE]) == 2
    finally:
        clear_cache()
    # the recipe names several loongsage-agents plugins (tool parser, dataset, agent, reward):
    # whichever validation meets first is the one reported
    assert catalogue.provider(err.value.kind, err.value.name) == "loongsage-agents"
    assert str(err.value).endswith(
        f"'{err.value.name}' ({err.value.kind}) comes with loongsage-agents, which is not installed; "
        "in a clone of LoongSage: make wheels && pip install dist/loongsage_agents-*.whl"
    )
    assert capsys.readouterr().err.strip() == f"error: {err.value}"
