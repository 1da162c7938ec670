"""Registries: one per plugin kind, filled through the hooks and frozen after loading.

Every registry behaves the same way (a lesson from verl, whose registries differ): a
second registration of a name raises ``DuplicatePluginError`` naming both distributions,
an unknown name raises ``UnknownPluginError`` naming the config key and the closest
match, and nothing can be registered once the registry is frozen.

``Registries.resolve`` is the one way a config node naming a plugin (a bare name, or a
mapping ``{name: ..., <params>}``; datasets key it by ``format``, sandboxes by ``type``)
becomes a ``PluginRef``: the registry entry plus its parameters typed by the plugin's own
dataclass, and the config key it came from (for every later error); for kinds whose nodes
also carry generic keys the core reads (every reward node's ``timeout_s`` and ``on_error``),
those are split off and typed by the core's own dataclass (``PluginRef.options``).
Everything downstream (validation, data sources, the objective, schedulers, the router,
trackers) receives ``PluginRef``s and never looks a name up again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from loongsage.errors import (
    ConfigError,
    DuplicatePluginError,
    RegistryFrozenError,
    UnknownPluginError,
)
from loongsage.kind_table import KINDS


def _first_doc_line(obj: Any) -> str:
    doc = getattr(obj, "__doc__", None) or ""
    return doc.strip().splitlines()[0].strip() if doc.strip() else ""


def resolve_target(target: str) -> Any:
    """Import ``"package.module:attribute"`` and return the attribute."""
    import importlib

    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj


def typed_values(schema: Any, values: Mapping[str, Any], key: str, what: str) -> Any:
    """``values`` merged over ``schema`` (a dataclass type, or an instance giving defaults) and
    built into an instance; a wrong name, type or value raises ``ConfigError`` under ``key``."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from loongsage.hints import omegaconf_error

    structured = OmegaConf.structured(schema)
    try:
        return OmegaConf.to_object(OmegaConf.merge(structured, dict(values)))
    except OmegaConfBaseException as err:
        known = OmegaConf.to_container(structured, resolve=False)
        error = omegaconf_error(err, known, prefix=key)
        raise ConfigError(error.key, f"invalid parameter for {what}: {error.problem}") from None
    except (ValueError, TypeError) as err:  # the dataclass's own checks (__post_init__)
        raise ConfigError(key, f"invalid parameters for {what}: {err}") from None


@dataclass(frozen=True)
class RegistryEntry:
    """One registered plugin object with where it came from and its parameter type.

    ``target`` is the object itself or a lazy ``"module:attribute"`` reference, imported on
    first use of ``obj`` so that listing plugins never imports torch.
    """

    kind: str
    name: str
    target: Any
    distribution: str
    params: type | None = None
    doc: str = ""

    @property
    def obj(self) -> Any:
        if not isinstance(self.target, str):
            return self.target
        cached = self.__dict__.get("_resolved")
        if cached is None:
            try:
                cached = resolve_target(self.target)
            except Exception as err:
                from loongsage.errors import PluginImportError
                import traceback

                raise PluginImportError(
                    f"{self.kind} '{self.name}' of distribution '{self.distribution}'",
                    self.target, traceback.format_exc(),
                ) from err
            object.__setattr__(self, "_resolved", cached)
        return cached

    def build_params(self, values: Mapping[str, Any] | None, key: str) -> Any:
        """Validate ``values`` against the entry's parameter dataclass and return an instance.

        ``key`` is the config path used in error messages. Entries without a parameter
        dataclass accept no parameters.
        """
        values = dict(values or {})
        if self.params is None:
            if values:
                raise ConfigError(
                    key, f"{self.kind} '{self.name}' takes no parameters, got {sorted(values)}"
                )
            return None
        return typed_values(self.params, values, key, f"{self.kind} '{self.name}'")

    def param_schema(self) -> list[dict[str, Any]]:
        """Describe the parameters as plain data (name, type, default) for listings."""
        if self.params is None:
            return []
        out = []
        for f in dataclasses.fields(self.params):
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                default = f.default_factory()  # type: ignore[misc]
            else:
                default = None
            type_name = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            out.append({"name": f.name, "type": type_name, "default": default})
        return out


@dataclass(frozen=True)
class PluginRef:
    """A config reference resolved once: the entry, its typed parameters, and the config key.

    Picklable (entries hold lazy ``"module:attribute"`` targets or module-level objects), so a
    ``PluginRef`` travels into Ray actors and reward worker processes as it is.
    """

    entry: RegistryEntry
    params: Any
    key: str
    options: Any = None  # the generic keys of the node, when its kind has some (a reward's deadline)

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def kind(self) -> str:
        return self.entry.kind

    @property
    def obj(self) -> Any:
        """The registered object (imported on first use)."""
        return self.entry.obj

    def flag(self, attribute: str) -> bool:
        """A boolean class attribute of the plugin's parameter dataclass (False when absent)."""
        return bool(self.trait(attribute, False))

    def trait(self, attribute: str, default: Any = None) -> Any:
        """A class attribute of the plugin's parameter dataclass (``default`` when absent):
        what a plugin declares about itself for validation, never a config key."""
        return getattr(self.entry.params, attribute, default)

    def as_node(self, name_field: str | None = None) -> dict[str, Any]:
        """The reference as a plain config node, every parameter (defaults included) spelled out,
        its name under ``name_field`` (default: its kind's, ``KindSpec.name_field``)."""
        name_field = name_field or KINDS[self.kind].name_field
        generic = dataclasses.asdict(self.options) if dataclasses.is_dataclass(self.options) else {}
        values = dataclasses.asdict(self.params) if dataclasses.is_dataclass(self.params) else {}
        return {name_field: self.name, **generic, **values}


def _check_reserved(entry: RegistryEntry, generic: set[str], key: str) -> None:
    own = {f.name for f in dataclasses.fields(entry.params)} if entry.params is not None else set()
    clash = sorted(own & generic)
    if clash:
        raise ConfigError(key, f"{entry.kind} '{entry.name}' of distribution '{entry.distribution}' "
                          f"declares parameter(s) {clash}, which every {entry.kind} node reserves for "
                          f"the core ({', '.join(sorted(generic))}); the plugin must rename them")


def _plain(node: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node


@dataclass
class Registry:
    """Named plugin objects of one kind."""

    kind: str
    _entries: dict[str, RegistryEntry] = field(default_factory=dict)
    _frozen: bool = False

    def add(
        self,
        name: str,
        obj: Any,
        distribution: str,
        params: type | None = None,
        doc: str | None = None,
    ) -> RegistryEntry:
        if self._frozen:
            raise RegistryFrozenError(
                f"{self.kind} registry is frozen; '{name}' from '{distribution}' came too late"
            )
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name from '{distribution}' must be a non-empty string")
        if params is not None and not dataclasses.is_dataclass(params):
            raise TypeError(
                f"{self.kind} '{name}' from '{distribution}': params must be a dataclass type"
            )
        if name in self._entries:
            raise DuplicatePluginError(
                self.kind, name, self._entries[name].distribution, distribution
            )
        if doc is None:
            doc = _first_doc_line(params if isinstance(obj, str) else obj)
        entry = RegistryEntry(self.kind, name, obj, distribution, params, doc)
        self._entries[name] = entry
        return entry

    def freeze(self) -> None:
        self._frozen = True

    @property
    def frozen(self) -> bool:
        return self._frozen

    def entry(self, name: str, key: str | None = None) -> RegistryEntry:
        """Return the entry called ``name``; ``key`` names the config field for errors."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UnknownPluginError(
                self.kind,
                name,
                key or KINDS[self.kind].config_field,
                {n: e.distribution for n, e in self._entries.items()},
            ) from None

    def get(self, name: str, key: str | None = None) -> Any:
        """Return the registered object called ``name``."""
        return self.entry(name, key).obj

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[RegistryEntry]:
        return iter(sorted(self._entries.values(), key=lambda e: e.name))

    def __len__(self) -> int:
        return len(self._entries)


class Registries:
    """One registry per plugin kind, addressable by kind name (``registries.policy_loss``)."""

    def __init__(self) -> None:
        self._by_kind = {kind: Registry(kind) for kind in KINDS}

    def __getattr__(self, kind: str) -> Registry:
        try:
            return self.__dict__["_by_kind"][kind]
        except KeyError:
            raise AttributeError(f"no plugin kind '{kind}'; kinds: {', '.join(KINDS)}") from None

    def __getitem__(self, kind: str) -> Registry:
        return getattr(self, kind)

    def __iter__(self) -> Iterator[Registry]:
        return iter(self._by_kind.values())

    def freeze(self) -> None:
        for registry in self._by_kind.values():
            registry.freeze()

    def unfrozen_copy(self) -> "Registries":
        """The same entries in registries that take more (``plugins.with_plugins``)."""
        copy = Registries()
        for kind, registry in self._by_kind.items():
            copy._by_kind[kind]._entries.update(registry._entries)
        return copy

    def resolve(
        self, kind: str, node: Any, key: str | None = None, name_field: str | None = None,
        options: Any = None, *, source: int | None = None,
    ) -> PluginRef:
        """Resolve one config node naming a ``kind`` plugin; errors name ``key``.

        ``key`` and ``name_field`` default to the kind's in the table of kinds (``KindSpec.key``,
        of data source ``source`` for a data source's field, and ``KindSpec.name_field``).
        ``node`` is the plugin's name or a mapping with ``name_field`` and its parameters,
        validated by the plugin's parameter dataclass. ``options`` (a dataclass instance) holds
        the generic keys every node of this kind may set next to the plugin's own parameters,
        with their defaults (a reward's ``timeout_s`` and ``on_error``): the node's values for
        them are taken out before the plugin's parameters are built, validated by the
        dataclass, and returned as ``PluginRef.options``. A plugin may not declare a parameter
        of the same name, which it could never receive.
        """
        key = key or KINDS[kind].key(source)
        name_field = name_field or KINDS[kind].name_field
        node = _plain(node)
        name_key = key if isinstance(node, str) else f"{key}.{name_field}"
        if isinstance(node, str):
            node = {name_field: node}
        if not isinstance(node, Mapping) or not isinstance(node.get(name_field), str) or not node[name_field]:
            raise ConfigError(key, f"expected a {kind} name or a mapping with '{name_field}', got {node!r}")
        values = dict(node)
        name = values.pop(name_field)
        entry = self[kind].entry(name, name_key)
        generic = {f.name for f in dataclasses.fields(options)} if options is not None else set()
        if generic:
            _check_reserved(entry, generic, key)
            given = {k: values.pop(k) for k in list(values) if k in generic}
            options = typed_values(options, given, key, f"{kind} '{name}'")
        try:
            params = entry.build_params(values, key)
        except (ValueError, TypeError) as err:
            if isinstance(err, ConfigError):
                raise
            raise ConfigError(key, f"invalid parameters for {kind} '{name}': {err}") from None
        return PluginRef(entry, params, key, options)

    def resolve_all(self, kind: str, nodes: Any, key: str | None = None, *,
                    source: int | None = None) -> tuple[PluginRef, ...]:
        """``resolve`` each node of a list (``None`` is an empty list); keys get ``[i]``."""
        key = key or KINDS[kind].key(source)
        nodes = _plain(nodes)
        if nodes is None:
            return ()
        if not isinstance(nodes, list):
            raise ConfigError(key, f"expected a list of {kind} references, got {nodes!r}")
        return tuple(self.resolve(kind, n, f"{key}[{i}]") for i, n in enumerate(nodes))

    def register_callable(self, kind: str, distribution: str) -> Callable[..., None]:
        """The ``register`` callable handed to one plugin's hook implementation."""
        registry = self[kind]

        def register(name: str, obj: Any, *, params: type | None = None, doc: str | None = None) -> None:
            registry.add(name, obj, distribution, params=params, doc=doc)

        register.__doc__ = f"Register a {kind} plugin: register(name, obj, *, params=None, doc=None)."
        return register
