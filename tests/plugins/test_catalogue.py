"""Core's catalogue of sibling plugins equals what the installed siblings really register."""

from __future__ import annotations

from importlib import metadata

from loongsage.catalogue import SIBLING_PLUGINS, install_hint, provider
from loongsage.plugins import load_plugins


def test_catalogue_equals_the_installed_siblings_registrations(monkeypatch):
    monkeypatch.delenv("LOONGSAGE_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("LOONGSAGE_LOAD_PLUGINS", raising=False)
    for distribution in SIBLING_PLUGINS:  # the test venv holds all five distributions
        metadata.distribution(distribution)
    registered: dict[str, dict[str, set[str]]] = {d: {} for d in SIBLING_PLUGINS}
    for registry in load_plugins():
        for entry in registry:
            if entry.distribution in registered:
                registered[entry.distribution].setdefault(registry.kind, set()).add(entry.name)
    assert registered == {
        d: {k: set(v) for k, v in kinds.items()} for d, kinds in SIBLING_PLUGINS.items()
    }


def test_core_names_and_unknown_names_have_no_provider():
    assert (
        provider("policy_loss", "ppo_clip") is None
        and install_hint("policy_loss", "ppo_clip") == ""
    )
    assert provider("policy_loss", "no_such_loss") is None
    assert provider("agent", "m2po") is None  # a name belongs to its kind
    assert provider("policy_loss", "m2po") == "loongsage-algos"
