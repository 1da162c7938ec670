"""One load path: ``loongsage train`` (and ``loongsage.train``) load every plugin once and compose
the recipe once. The CLI's ``main`` loads the installed plugins for its commands and hands them
to ``load_config``, which adds the recipe's local plugin modules (read from the recipe file and
the command line before composing) without discovering or calling the installed ones again.
The controller is replaced by a probe that keeps the ``RunConfig``: nothing starts."""

from __future__ import annotations

import textwrap
from collections import Counter
from pathlib import Path

import pytest

import loongsage.config.compose as compose
import loongsage
import loongsage.controller
import loongsage.plugins as plugins
from loongsage import cli
from loongsage.errors import ConfigError

LOCAL_PLUGIN = '''
from loongsage import hookimpl

def terse(text, ground_truth, params, **context):
    return float(len(text) < 10)

@hookimpl
def loongsage_register_rewards(register):
    register("terse", "probe_load_path_plugin:terse")
'''


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """Counts of entry-point discovery, default-plugin loading and Hydra compositions, the
    plugins whose hooks each registry fill called, and the run configs the controller got."""
    counts: Counter = Counter()
    fills: list[list[str]] = []
    runs: list = []
    for owner, name in ((plugins.PluginManager, "load_entry_points"), (plugins.PluginManager, "load_defaults"),
                        (compose, "_hydra_compose")):
        original = getattr(owner, name)

        def counting(*args, _original=original, _name=name, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counting)
    fill = plugins.PluginManager.fill

    def recording_fill(self, registries):
        fills.append([self.pm.get_name(p) for p in self.pm.get_plugins()])
        return fill(self, registries)

    def probe_training(run):
        runs.append(run)
        (tmp_path / "run").mkdir(exist_ok=True)
        (tmp_path / "run" / "metrics.jsonl").write_text("")
        return str(tmp_path / "run")

    monkeypatch.setattr(plugins.PluginManager, "fill", recording_fill)
    monkeypatch.setattr(loongsage.controller, "run_training", probe_training)
    (tmp_path / "probe_load_path_plugin.py").write_text(textwrap.dedent(LOCAL_PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins.clear_cache()
    yield counts, fills, runs
    plugins.clear_cache()


def called_once_each(fills: list[list[str]]) -> bool:
    names = [name for fill in fills for name in fill]
    return len(names) == len(set(names))


def test_cli_train_with_a_local_plugin_module_loads_every_plugin_once_and_composes_once(counted):
    counts, fills, runs = counted
    assert cli.main(["train", "--config-name", "tiny/grpo", "plugins=[probe_load_path_plugin]",
                     "data_sources.0.reward=terse"]) == 0
    assert counts == {"load_entry_points": 1, "load_defaults": 1, "_hydra_compose": 1}
    assert called_once_each(fills) and "probe_load_path_plugin" in fills[-1]
    [run] = runs
    assert run.sources[0].reward.name == "terse" and run.cfg.plugins == ["probe_load_path_plugin"]


def test_python_train_with_a_callable_reward_composes_once(counted):
    counts, fills, runs = counted

    def short(text, ground_truth, params, **context):
        return 1.0

    loongsage.train("tiny/grpo", ["trainer.steps=1"], reward=short)
    assert counts == {"load_entry_points": 1, "load_defaults": 1, "_hydra_compose": 1}
    assert called_once_each(fills)
    [run] = runs
    assert [s.reward.name for s in run.sources] == ["short"]
    assert run.overrides == ("trainer.steps=1", "data_sources.0.reward=short")


def test_local_plugins_named_only_through_a_defaults_list_are_refused_by_name(counted, tmp_path):
    """They would be known only after composing, so the composition could not see them."""
    (tmp_path / "base.yaml").write_text("defaults:\n  - /tiny/grpo\n  - _self_\nplugins: [probe_load_path_plugin]\n")
    (tmp_path / "child.yaml").write_text("defaults:\n  - base\n  - _self_\n")
    assert compose.declared_plugins("base", [], str(tmp_path)) == ["probe_load_path_plugin"]
    with pytest.raises(ConfigError, match=r"plugins: \['probe_load_path_plugin'\] came through the recipe's "
                                          r"defaults list; name local plugin modules in the recipe file itself"):
        compose.load_config("child", [], str(tmp_path))
    run = compose.load_config("child", ["plugins=[probe_load_path_plugin]"], str(tmp_path))
    assert run.cfg.plugins == ["probe_load_path_plugin"]


def test_a_deleted_or_replaced_plugins_list_on_the_command_line_wins(tmp_path: Path):
    (tmp_path / "mine.yaml").write_text("defaults:\n  - /tiny/grpo\n  - _self_\nplugins: [a_module]\n")
    assert compose.declared_plugins("mine", ["plugins=[b_module]"], str(tmp_path)) == ["b_module"]
    assert compose.declared_plugins("mine", ["~plugins"], str(tmp_path)) == []
    with pytest.raises(ConfigError, match="plugins: expected a list of importable module names, got 3"):
        compose.declared_plugins("mine", ["plugins=3"], str(tmp_path))
