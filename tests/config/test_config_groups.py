"""Every plugin kind's parameters are typed in Hydra's ConfigStore and listed by ``config show``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from loongsage.config.store import PLUGIN_GROUPS, publish_plugin_params, stored_options
from loongsage.plugins import get_registries
from loongsage.registry import KINDS

REGISTRIES = get_registries()


@pytest.fixture(autouse=True, scope="module")
def _published():
    """Publish every group here: this file may run before any test that loads a config."""
    publish_plugin_params(REGISTRIES)


def _run_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "loongsage.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )


def test_every_kind_has_a_group_and_only_single_nodes_are_selectable():
    # commands are named on the command line, step terms are picked by their own config section
    configurable = set(KINDS) - {"command", "step_term"}
    assert {g.kind for g in PLUGIN_GROUPS.values()} == configurable
    for group in PLUGIN_GROUPS.values():
        assert group.group == group.field.replace("[*]", "").replace(".", "/")
        single_node = "[*]" not in group.field and group.name_field == "name"
        assert group.selectable == single_node, group.group


@pytest.mark.parametrize("group", PLUGIN_GROUPS)
def test_group_options_are_the_registered_plugins_with_their_typed_parameters(group):
    plugin_group = PLUGIN_GROUPS[group]
    options = stored_options(group)  # the store is process-wide: other tests' plugins may be in it
    registry = REGISTRIES[plugin_group.kind]
    assert set(registry.names()) <= set(options)
    for name in registry.names():
        params = options[name]
        schema = registry.entry(name).param_schema()
        assert [(p.name, p.default) for p in params] == [(p["name"], p["default"]) for p in schema]
        assert all(p.type for p in params)


def test_a_list_entry_option_is_type_checked_by_omegaconf():
    store = ConfigStore.instance()
    node = store.load(f"{PLUGIN_GROUPS['data_sources/agent'].path}/tool_loop.yaml").node
    assert node.name == "tool_loop" and node.max_turns == 4
    with pytest.raises(ValidationError, match="max_turns"):
        OmegaConf.merge(node, {"max_turns": "many"})
    dataset = store.load(f"{PLUGIN_GROUPS['data_sources/dataset'].path}/synthetic_math.yaml").node
    assert (
        dataset.format == "synthetic_math" and "name" not in dataset
    )  # its name field is `format`


def test_cli_lists_a_group_with_types_and_defaults():
    result = _run_cli("config", "show", "--group", "data_sources/agent")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("data_sources/agent  (agent options of data_sources[*].agent;")
    listed = [ln.split()[0] for ln in lines[1:] if not ln.startswith("      ")]
    assert listed == REGISTRIES.agent.names()
    block = lines[lines.index(next(ln for ln in lines if ln.split()[:1] == ["tool_loop"])) :]
    assert "      max_turns: int = 4" in block and "      tool_timeout_s: float = 10.0" in block
    required = _run_cli("config", "show", "--group", "data_sources/dataset").stdout
    assert "      path: str = required" in required


def test_cli_refuses_an_unknown_group_with_the_closest():
    result = _run_cli("config", "show", "--group", "agent")
    assert result.returncode == 2
    assert (
        "error: --group: unknown config group 'agent'; did you mean data_sources/agent?"
        in result.stderr
    )


def test_cli_group_listing_includes_the_recipes_local_plugins(tmp_path):
    (tmp_path / "my_trackers.py").write_text(
        textwrap.dedent('''
        from dataclasses import dataclass
        from loongsage import hookimpl

        @dataclass
        class EveryParams:
            """Log every n steps."""
            n: int = 3

        @hookimpl
        def loongsage_register_trackers(register):
            register("every_n", "my_trackers:EveryParams", params=EveryParams)
    ''')
    )
    (tmp_path / "mine.yaml").write_text(
        "defaults:\n  - /tiny/grpo\n  - _self_\nplugins: [my_trackers]\n"
    )
    result = _run_cli(
        "config",
        "show",
        "--config-dir",
        str(tmp_path),
        "--config-name",
        "mine",
        "--group",
        "logging/trackers",
        PYTHONPATH=str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert "local:my_trackers" in result.stdout and "      n: int = 3" in result.stdout
    without = _run_cli(
        "config", "show", "--group", "logging/trackers", PYTHONPATH=str(tmp_path)
    ).stdout
    assert "every_n" not in without
