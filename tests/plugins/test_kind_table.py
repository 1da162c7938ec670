"""The table of kinds is the one declaration: hooks, registries, config groups and docs follow it."""

from __future__ import annotations

from pathlib import Path

import pluggy

from loongsage import hookspecs
from loongsage.config.store import PLUGIN_GROUPS
from loongsage.kind_table import KIND_TABLE, KindSpec
from loongsage.plugin import KIND_CONTRACTS
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
