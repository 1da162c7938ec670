"""The plugin manager: discovery, load order, and filling the registries.

Load order (docs/plugins.md): installed entry points of group ``loongsage`` (skipped when
``LOONGSAGE_DISABLE_PLUGIN_AUTOLOAD`` is set; ``LOONGSAGE_LOAD_PLUGINS`` is a comma
separated allow-list of entry-point names), then local modules named in the config's
``plugins:`` list, then core's ``DEFAULT_PLUGINS``. ``check_pending()`` then rejects
misspelled hook implementations, every hook is called once per plugin with a
``register`` bound to that plugin's distribution, and the registries are frozen.

Unlike pluggy's own ``load_setuptools_entrypoints``, two distributions using the same
entry-point name is an error (pluggy would silently skip the second), and a module that
fails to import is reported with its distribution and traceback, never skipped.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from importlib.metadata import entry_points
from typing import Iterable

import pluggy

from loongsage import hookspecs
from loongsage.errors import LoongSageError, PluginImportError
from loongsage.registry import KINDS, Registries

ENTRY_POINT_GROUP = "loongsage"
CORE_DISTRIBUTION = "loongsage-core"

DEFAULT_PLUGINS: tuple[str, ...] = (
    "loongsage.algorithms.plugin",
    "loongsage.runtime.plugin",
    "loongsage.engines.plugin",
    "loongsage.tracking.plugin",
    "loongsage.agentflow.plugin",
    "loongsage.models.plugin",
    "loongsage.viz.plugin",
    "loongsage.controller.plugin",
)


def _entry_points():
    return entry_points(group=ENTRY_POINT_GROUP)


def _import(module: str, source: str):
    try:
        return importlib.import_module(module)
    except Exception:
        raise PluginImportError(source, module, traceback.format_exc()) from None


class PluginManager:
    """Wraps ``pluggy.PluginManager("loongsage")`` and remembers each plugin's distribution."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("loongsage")
        self.pm.add_hookspecs(hookspecs)
        self.distribution_of: dict[str, str] = {}

    def register(self, plugin: object, name: str, distribution: str) -> None:
        if self.pm.has_plugin(name):
            raise LoongSageError(
                f"plugin name '{name}' from '{distribution}' is already used by "
                f"'{self.distribution_of.get(name, '?')}'; entry-point names must be unique"
            )
        self.pm.register(plugin, name=name)
        self.distribution_of[name] = distribution

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)
        self.distribution_of.pop(name, None)

    def load_entry_points(self) -> None:
        if os.environ.get("LOONGSAGE_DISABLE_PLUGIN_AUTOLOAD"):
            return
        allow = os.environ.get("LOONGSAGE_LOAD_PLUGINS")
        allowed = {n.strip() for n in allow.split(",") if n.strip()} if allow is not None else None
        for ep in sorted(_entry_points(), key=lambda e: e.name):
            if allowed is not None and ep.name not in allowed:
                continue
            dist = ep.dist.name if ep.dist is not None else ep.name
            try:
                plugin = ep.load()
            except Exception:
                raise PluginImportError(
                    f"distribution '{dist}' (entry point '{ep.name}')", ep.value, traceback.format_exc()
                ) from None
            self.register(plugin, ep.name, dist)

    def load_local(self, modules: Iterable[str]) -> None:
        for module in modules:
            plugin = _import(module, "the config's plugins list")
            self.register(plugin, module, f"local:{module}")

    def load_defaults(self) -> None:
        for module in DEFAULT_PLUGINS:
            if not self.pm.has_plugin(module):
                self.register(_import(module, CORE_DISTRIBUTION), module, CORE_DISTRIBUTION)

    def fill(self, registries: Registries) -> Registries:
        """Call every hook once per plugin, each with a register bound to its distribution."""
        self.pm.check_pending()
        for kind in KINDS.values():
            caller = getattr(self.pm.hook, kind.hook)
            for impl in caller.get_hookimpls():
                plugin_name = self.pm.get_name(impl.plugin)
                dist = self.distribution_of.get(plugin_name, plugin_name or "unknown")
                impl.function(register=registries.register_callable(kind.name, dist))
        return registries


def load_plugins(local_modules: Iterable[str] = (), extra: Iterable[tuple[object, str]] = ()) -> Registries:
    """Discover and load every plugin in the documented order; return frozen registries.

    ``extra`` holds ``(plugin_object, name)`` pairs registered at run time (tests,
    notebooks); they load after the config's local modules and before the defaults.
    """
    manager = PluginManager()
    manager.load_entry_points()
    manager.load_local(local_modules)
    for plugin, name in extra:
        manager.register(plugin, name, name)
    manager.load_defaults()
    registries = manager.fill(Registries())
    registries.freeze()
    return registries


def with_plugins(registries: Registries, local_modules: Iterable[str] = (),
                 extra: Iterable[tuple[object, str]] = ()) -> Registries:
    """``registries`` and the plugins of ``local_modules`` and ``extra`` (as ``load_plugins``
    takes them): only the new plugins' hooks are called, so a run whose installed plugins are
    already loaded (the CLI's) loads nothing twice. A name the new plugins register again is
    refused as in one load."""
    manager = PluginManager()
    manager.load_local(local_modules)
    for plugin, name in extra:
        manager.register(plugin, name, name)
    extended = manager.fill(registries.unfrozen_copy())
    extended.freeze()
    return extended


_CACHE: dict[tuple, Registries] = {}


def get_registries(local_modules: Iterable[str] = ()) -> Registries:
    """Load plugins once per process and set of local modules, then reuse the registries.

    For entry points (the CLI's listings) and tests only: library code receives the
    registries of its run, never this process-wide set.
    """
    key = (tuple(local_modules), os.environ.get("LOONGSAGE_DISABLE_PLUGIN_AUTOLOAD"),
           os.environ.get("LOONGSAGE_LOAD_PLUGINS"), tuple(sys.path))
    if key not in _CACHE:
        _CACHE[key] = load_plugins(local_modules)
    return _CACHE[key]


def clear_cache() -> None:
    """Forget loaded registries (tests installing packages or registering plugins)."""
    _CACHE.clear()
