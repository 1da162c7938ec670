"""Hydra ConfigStore wiring: the root schema and one config group per plugin-bound field.

Each registered plugin of a kind that binds a single config field (advantage, policy
loss, IS correction, window policy) is stored as an option of that field's config group,
under the plugin's name, typed by its parameter dataclass plus a ``name`` field. So
``algorithm/policy_loss=m2po algorithm.policy_loss.threshold=0.05`` is validated by Hydra
itself, and Hydra lists the valid options.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from loongsage.schema import SECTIONS, DataSourceConfig

if TYPE_CHECKING:
    from loongsage.registry import Registries

SCHEMA_NAME = "loongsage_schema"

# kind -> config group holding one option per registered plugin of that kind
PLUGIN_GROUPS: dict[str, str] = {
    "advantage": "algorithm/advantage_estimator",
    "policy_loss": "algorithm/policy_loss",
    "is_correction": "algorithm/is_correction",
    "window_policy": "async/window_policy",
}


def root_schema():
    """The root config node: every typed section, data sources and local plugin modules."""
    node = {name: OmegaConf.structured(cls) for name, cls in SECTIONS.items()}
    node["data_sources"] = OmegaConf.create([])
    node["plugins"] = OmegaConf.create([])
    return OmegaConf.create(node)


def data_source_schema():
    return OmegaConf.structured(DataSourceConfig)


def plugin_option_type(name: str, params: type | None) -> type:
    """A dataclass with the plugin's parameters plus ``name`` defaulting to the plugin name."""
    bases = (params,) if params is not None else ()
    safe = "".join(c if c.isalnum() else "_" for c in name)
    return dataclasses.make_dataclass(f"{safe}_option", [("name", str, name)], bases=bases)


def publish_plugin_params(registries: "Registries") -> None:
    """Store the root schema and each plugin-bound group option in Hydra's ConfigStore."""
    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=root_schema())
    for kind, group in PLUGIN_GROUPS.items():
        for entry in registries[kind]:
            store.store(group=group, name=entry.name, node=plugin_option_type(entry.name, entry.params))
