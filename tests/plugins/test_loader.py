"""Load order, environment switches, local modules, import failures, check_pending."""

from __future__ import annotations

import sys
import textwrap

import pluggy
import pytest

from loongsage.errors import PluginImportError
from loongsage.plugins import load_plugins


@pytest.fixture
def local_module(tmp_path, monkeypatch):
    """Write a module into a folder on sys.path and return its name."""

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        monkeypatch.syspath_prepend(str(tmp_path))
        sys.modules.pop(name, None)
        return name

    return write


def test_entry_points_of_sibling_distributions_load(monkeypatch):
    monkeypatch.delenv("LOONGSAGE_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("LOONGSAGE_LOAD_PLUGINS", raising=False)
    registries = load_plugins()
    dists = {e.distribution for r in registries for e in r}
    assert {"loongsage-core", "loongsage-agents", "loongsage-algos"} <= dists


def test_autoload_switch_keeps_only_core_defaults(monkeypatch):
    monkeypatch.setenv("LOONGSAGE_DISABLE_PLUGIN_AUTOLOAD", "1")
    registries = load_plugins()
    assert {e.distribution for r in registries for e in r} == {"loongsage-core"}


def test_allow_list_loads_only_named_entry_points(monkeypatch):
    monkeypatch.delenv("LOONGSAGE_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.setenv("LOONGSAGE_LOAD_PLUGINS", "loongsage_algos")
    dists = {e.distribution for r in load_plugins() for e in r}
    assert dists == {"loongsage-core", "loongsage-algos"}


def test_config_named_local_module_registers(local_module, monkeypatch):
    monkeypatch.setenv("LOONGSAGE_DISABLE_PLUGIN_AUTOLOAD", "1")
    name = local_module(
        "my_local_plugin",
        """
        from loongsage import hookimpl

        @hookimpl
        def loongsage_register_rewards(register):
            register("always_one", lambda *a, **k: 1.0, doc="Always 1.")
        """,
    )
    registries = load_plugins([name])
    assert registries.reward.entry("always_one").distribution == "local:my_local_plugin"


def test_local_module_that_fails_to_import_is_reported_not_skipped(local_module):
    name = local_module("my_broken_plugin", "import definitely_not_installed_pkg\n")
    with pytest.raises(PluginImportError) as err:
        load_plugins([name])
    text = str(err.value)
    assert "my_broken_plugin" in text and "the config's plugins list" in text
    assert "Traceback" in text and "definitely_not_installed_pkg" in text


def test_misspelled_hook_implementation_is_rejected(local_module, monkeypatch):
    monkeypatch.setenv("LOONGSAGE_DISABLE_PLUGIN_AUTOLOAD", "1")
    name = local_module(
        "my_typo_plugin",
        """
        from loongsage import hookimpl

        @hookimpl
        def loongsage_register_reward(register):
            pass
        """,
    )
    with pytest.raises(pluggy.PluginValidationError, match="loongsage_register_reward"):
        load_plugins([name])
