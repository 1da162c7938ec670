"""The table of kinds is the one declaration: hooks, registries, config groups, the keys
validation resolves each field under, and the docs follow it."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pluggy
import pytest
from omegaconf import DictConfig, OmegaConf

from loongsage import hookspecs
from loongsage.config.compose import load_config
from loongsage.errors import UnknownPluginError
from loongsage.config.store import PLUGIN_GROUPS
from loongsage.kind_table import KIND_TABLE, KindSpec
from loongsage.plugin import KIND_CONTRACTS
from loongsage.plugins import get_registries
from loongsage.registry import KINDS

REPO = Path(__file__).resolve().parents[2]


def test_every_kind_has_its_hook_registry_groups_and_contract_from_the_table():
    manager = pluggy.PluginManager("loongsage")
    manager.add_hookspecs(hookspecs)
    for kind in KIND_TABLE:
        assert KINDS[kind.name] is kind
        spec = getattr(manager.hook, kind.hook).spec
        assert spec.argnames == ("register",) and spec.function.__doc__ == kind.doc
        assert [g.field for g in PLUGIN_GROUPS.values() if g.kind == kind.name] == [f for f, _ in kind.fields]
        assert KIND_CONTRACTS[kind.name] == kind.contract
    assert len(manager.hook.__dict__) == len(KIND_TABLE)


def test_a_fields_group_follows_from_its_path_and_name_field():
    kind = KindSpec("scorer", "loongsage_register_scorers", "Register scorers.", "Scorer",
                    "data_sources[*].scorer.name",
                    (("data_sources[*].scorer", "name"), ("scoring.default", "name"), ("scoring.backend", "")))
    assert [(g.group, g.path, g.selectable) for g in kind.groups()] == [
        ("data_sources/scorer", "plugin_options/data_sources/scorer", False),
        ("scoring/default", "scoring/default", True),
        ("scoring/backend", "plugin_options/scoring/backend", False),
    ]


def test_plugins_md_lists_the_kinds_of_the_table():
    text = (REPO / "docs" / "plugins.md").read_text(encoding="utf-8")
    for kind in KIND_TABLE:
        named_by = ", ".join(f"`{path}.{name}`" if name else f"`{path}`" for path, name in kind.fields)
        row = f"| {kind.name} | `{kind.hook}` | {named_by or kind.named_by} | `{kind.contract}` |"
        assert row in text, row


def test_a_kinds_key_and_name_field_come_from_its_fields():
    assert (KINDS["dataset"].key(2), KINDS["dataset"].name_field) == ("data_sources[2].dataset", "format")
    assert (KINDS["sandbox"].key(0), KINDS["sandbox"].name_field) == ("data_sources[0].sandbox", "type")
    assert KINDS["data_filter"].key() == "algorithm.filters"
    assert KINDS["data_filter"].key(1) == "data_sources[1].filters"
    assert (KINDS["kl_policy"].key(), KINDS["kl_policy"].name_field) == ("algorithm.kl.method", "name")
    assert KINDS["tracker"].key() == "logging.trackers"
    with pytest.raises(ValueError, match="'engine' has 2 run-wide fields"):
        KINDS["engine"].key()  # train.backend and rollout.backend: the caller names which
    with pytest.raises(ValueError, match="'policy_loss' has 0 per-source fields"):
        KINDS["policy_loss"].key(0)


def _unknown_at(path: str, name_field: str) -> tuple[Callable[[DictConfig], None], str]:
    """A change naming an unknown plugin at the table's field ``path``; the key its error names."""
    value: object = {name_field: "no_such_plugin"} if name_field else "no_such_plugin"
    key = path.replace("data_sources[*]", "data_sources[0]")
    if key.endswith("[*]"):
        value, key = [value], key.replace("[*]", "[0]")

    def adjust(cfg: DictConfig) -> None:
        if key.startswith("data_sources[0]."):
            field = path.removeprefix("data_sources[*].").removesuffix("[*]")
            if field == "environment":  # an environment replaces the source's own triple
                for own in ("dataset", "agent", "reward"):
                    cfg.data_sources[0][own] = None
            cfg.data_sources[0][field] = value
        else:
            OmegaConf.update(cfg, path.removesuffix("[*]"), value, merge=False)

    return adjust, f"{key}.{name_field}" if name_field else key


@pytest.mark.parametrize("path,name_field", [f for kind in KIND_TABLE for f in kind.fields])
def test_validation_names_the_tables_key_of_every_field(path, name_field):
    """An unknown name in each field of the table fails under the key the table gives it."""
    adjust, key = _unknown_at(path, name_field)
    with pytest.raises(UnknownPluginError) as err:
        load_config("tiny/grpo", registries=get_registries(), adjust=adjust)
    assert (err.value.key, err.value.name) == (key, "no_such_plugin")
    assert err.value.kind == PLUGIN_GROUPS[path.replace("[*]", "").replace(".", "/")].kind
