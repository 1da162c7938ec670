"""Registries: duplicates, unknown names, lazy targets, parameters, freezing."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from loongsage import hookimpl
from loongsage.errors import (
    ConfigError,
    DuplicatePluginError,
    PluginImportError,
    RegistryFrozenError,
    UnknownPluginError,
)
from loongsage.registry import KINDS, Registry


@dataclass
class TauParams:
    """A loss with one typed knob."""

    tau: float = 0.04
    mode: str = "mask"


def test_duplicate_name_names_both_distributions():
    registry = Registry("policy_loss")
    registry.add("m2po", object(), "loongsage-algos")
    with pytest.raises(DuplicatePluginError) as err:
        registry.add("m2po", object(), "my-plugin")
    assert "loongsage-algos" in str(err.value) and "my-plugin" in str(err.value)


def test_unknown_name_names_key_kind_options_and_closest_match():
    registry = Registry("policy_loss")
    registry.add("m2po", object(), "loongsage-algos")
    registry.add("ppo_clip", object(), "loongsage-core")
    with pytest.raises(UnknownPluginError) as err:
        registry.get("m2p0", "algorithm.policy_loss.name")
    message = str(err.value)
    assert message.startswith("algorithm.policy_loss.name: unknown policy_loss 'm2p0'")
    assert "Did you mean 'm2po'?" in message
    assert "m2po (loongsage-algos)" in message and "ppo_clip (loongsage-core)" in message
    assert err.value.closest == "m2po"


def test_unknown_name_without_key_uses_the_kind_config_field():
    with pytest.raises(UnknownPluginError, match=r"^algorithm\.kl\.method: unknown kl_policy 'zz'"):
        Registry("kl_policy").get("zz")


def test_lazy_target_is_imported_on_first_use_and_failures_name_the_distribution():
    registry = Registry("reward")
    registry.add("sqrt", "math:sqrt", "dist-a")
    registry.add("broken", "no_such_module_xyz:fn", "dist-b")
    assert registry.get("sqrt")(9) == 3
    with pytest.raises(PluginImportError) as err:
        registry.get("broken")
    assert "dist-b" in str(err.value) and "No module named 'no_such_module_xyz'" in str(err.value)


def test_params_are_typed_and_errors_name_the_key():
    registry = Registry("policy_loss")
    entry = registry.add("m2po", "math:fabs", "loongsage-algos", params=TauParams)
    assert entry.build_params({"tau": "0.5"}, "algorithm.policy_loss") == TauParams(0.5, "mask")
    with pytest.raises(ConfigError, match=r"^algorithm\.policy_loss\.tau: .*expected a number, got 'big'"):
        entry.build_params({"tau": "big"}, "algorithm.policy_loss")
    with pytest.raises(ConfigError, match=r"^algorithm\.policy_loss\.nope: .*unknown key"):
        entry.build_params({"nope": 1}, "algorithm.policy_loss")
    with pytest.raises(ConfigError, match=r"did you mean algorithm\.policy_loss\.tau\?"):
        entry.build_params({"taw": 1}, "algorithm.policy_loss")
    assert entry.doc == "A loss with one typed knob."


def test_entry_without_params_rejects_parameters():
    entry = Registry("kl_policy").add("k1", object(), "core")
    with pytest.raises(ConfigError, match="takes no parameters"):
        entry.build_params({"x": 1}, "algorithm.kl")


def test_frozen_registry_refuses_late_registration(registries_with):
    registries = registries_with()
    with pytest.raises(RegistryFrozenError):
        registries.tracker.add("late", object(), "someone")


def test_runtime_plugin_registers_and_is_gone_afterwards(registries_with):
    class Plugin:
        @staticmethod
        @hookimpl
        def loongsage_register_policy_losses(register):
            register("runtime_loss", "math:fabs", params=TauParams)

    with_plugin = registries_with(Plugin)
    assert with_plugin.policy_loss.entry("runtime_loss").distribution == "runtime_plugin_0"
    assert "runtime_loss" not in registries_with().policy_loss


def test_second_distribution_claiming_a_core_name_fails_at_load(registries_with):
    class Impostor:
        @staticmethod
        @hookimpl
        def loongsage_register_trackers(register):
            register("jsonl", object())

    with pytest.raises(DuplicatePluginError, match="jsonl"):
        registries_with(Impostor)


def test_seventeen_kinds_each_with_one_hook():
    from loongsage import hookspecs

    assert len(KINDS) == 17
    for kind in KINDS.values():
        assert callable(getattr(hookspecs, kind.hook))
