"""Hydra ConfigStore wiring: the root schema and one config group per plugin-naming field.

Every config field that names a plugin has a config group holding one option per registered
plugin of its kind, under the plugin's name, typed by the plugin's parameter dataclass plus
its name field (``name``; ``format`` for datasets, ``type`` for sandboxes). So Hydra itself
type-checks every plugin's parameters and ``loongsage config show --group GROUP`` lists the
options of any group with their typed parameters and defaults.

Only the groups of single config nodes are *selectable*: ``algorithm/policy_loss=m2po``
swaps the whole node. A list entry (a data source's agent, a tracker, a filter) or a field
holding a bare name (``train.backend``) cannot be picked with ``group=option``; their groups
are stored for the types and the listing under ``plugin_options/`` (so ``train`` or
``data_sources`` never turn into Hydra group folders), and ``compose`` refuses a selection of
them with the override that does work. The groups are the fields of the table of kinds
(``loongsage.kind_table``).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, ListConfig, OmegaConf

from loongsage.config.step_terms import data_source_type, section_types
from loongsage.kind_table import KIND_TABLE, PluginGroup

if TYPE_CHECKING:
    from loongsage.registry import Registries

SCHEMA_NAME = "loongsage_schema"

# group path -> its config group: one per plugin-naming field of the table of kinds, the
# selectable groups first (the order `loongsage train --help` lists them in)
PLUGIN_GROUPS: dict[str, PluginGroup] = {
    g.group: g
    for g in sorted((g for kind in KIND_TABLE for g in kind.groups()), key=lambda g: not g.selectable)
}


def root_schema(registries: "Registries | None" = None):
    """The root config node: every typed section (core's, and those of the installed step
    terms in ``registries``: ``config.step_terms``), typed data sources, local plugin modules."""
    node = {name: OmegaConf.structured(cls) for name, cls in section_types(registries).items()}
    node["data_sources"] = ListConfig([], element_type=data_source_type(registries))
    node["plugins"] = OmegaConf.create([])
    return OmegaConf.create(node)


def data_source_schema(registries: "Registries | None" = None):
    return OmegaConf.structured(data_source_type(registries))


def plugin_option_type(name: str, params: type | None, name_field: str = "name") -> type:
    """A dataclass with the plugin's parameters plus its name field defaulting to ``name``."""
    bases = (params,) if params is not None else ()
    safe = "".join(c if c.isalnum() else "_" for c in name)
    return dataclasses.make_dataclass(f"{safe}_option", [(name_field or "name", str, name)], bases=bases)


def publish_plugin_params(registries: "Registries") -> None:
    """Store the root schema and every plugin group's options in Hydra's ConfigStore."""
    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=root_schema(registries))
    for group in PLUGIN_GROUPS.values():
        for entry in registries[group.kind]:
            node = plugin_option_type(entry.name, entry.params, group.name_field)
            store.store(group=group.path, name=entry.name, node=node)


@dataclass(frozen=True)
class OptionParam:
    """One typed parameter of a stored group option, as ``config show --group`` prints it."""

    name: str
    type: str
    default: Any  # MISSING ("???") when the parameter is required

    @property
    def required(self) -> bool:
        return self.default == MISSING


def _type_name(tp: Any) -> str:
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "").replace("NoneType", "None")


def stored_options(group: str) -> dict[str, list[OptionParam]]:
    """The options Hydra's ConfigStore holds for ``group``, each with its typed parameters."""
    plugin_group = PLUGIN_GROUPS[group]
    store = ConfigStore.instance()
    out: dict[str, list[OptionParam]] = {}
    for filename in store.list(plugin_group.path):
        name = filename.removesuffix(".yaml")
        node = store.load(f"{plugin_group.path}/{filename}").node
        option_type = OmegaConf.get_type(node)
        hints = typing.get_type_hints(option_type)
        values = OmegaConf.to_container(node, resolve=False)
        out[name] = [
            OptionParam(f.name, _type_name(hints[f.name]), values[f.name])
            for f in dataclasses.fields(option_type)
            if f.name != (plugin_group.name_field or "name")
        ]
    return out
