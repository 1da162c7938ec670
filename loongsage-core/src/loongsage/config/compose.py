"""Compose a run configuration from recipes with Hydra, then validate it.

``load_config`` is the only way a command gets its config, and each step happens once: the
installed plugins are loaded (or handed in already loaded, as the CLI does), the local plugin
modules the recipe names in ``plugins:`` (read from the recipe file and the command line
before composing, since the composition needs their parameter groups) are added, every
plugin's parameter groups go to the ConfigStore, the recipe is composed with Hydra and the
result validated before anything starts, returning the ``RunConfig`` with every plugin
resolved.

Hydra's errors are translated, never passed through: its hint for an unknown key is to add
it with ``+``, which is wrong for every typed section, and "Error merging override
trainer.steps=abc" drops the reason. A failed composition is explained from the OmegaConf
error underneath, with the closest existing key taken from the config composed without the
failing override (``loongsage.hints``).
"""

from __future__ import annotations

import dataclasses
import difflib
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Sequence

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from loongsage.catalogue import install_hint
from loongsage.config.store import PLUGIN_GROUPS, publish_plugin_params, root_schema
from loongsage.config.validate import RunConfig, validate_config
from loongsage.errors import ConfigError, UnknownPluginError
from loongsage.hints import closest_key, omegaconf_error, split_key
from loongsage.plugins import load_plugins, with_plugins
from loongsage.registry import Registries


def recipes_dir() -> Path:
    """The bundled recipes: the repository's top-level ``recipes/``, package data of
    ``loongsage`` through the link ``loongsage/recipes`` (the wheel holds the files), so an
    installed wheel finds them as a checkout does; ``--config-dir`` adds the user's own."""
    return Path(str(resources.files("loongsage") / "recipes"))


def list_recipes(root: Path | None = None) -> list[str]:
    """Every recipe name under ``root`` (``tiny/grpo``, ...), for listing and tests."""
    root = root or recipes_dir()
    return sorted(
        str(p.relative_to(root).with_suffix(""))
        for p in root.rglob("*.yaml")
        if not p.name.startswith("_")
    )


def _hydra_compose(config_name: str, overrides: Sequence[str], config_dir: str | None) -> DictConfig:
    bundled = recipes_dir()
    primary = Path(config_dir).resolve() if config_dir else bundled
    extra = [f"hydra.searchpath=[file://{bundled}]"] if config_dir else []
    with initialize_config_dir(version_base=None, config_dir=str(primary)):
        cfg = compose(config_name=config_name, overrides=[*overrides, *extra])
    return OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]) if "hydra" in cfg else cfg


def _compose(config_name: str, overrides: Sequence[str], config_dir: str | None,
             registries: Registries) -> DictConfig:
    _refuse_split_values(overrides)
    _refuse_listing_groups(overrides)
    try:
        return _hydra_compose(config_name, overrides, config_dir)
    except MissingConfigException as err:
        if err.missing_cfg_file == config_name:
            raise unknown_recipe_error(config_name, config_dir) from None
        raise _missing_option_error(err, registries) from None
    except HydraException as err:
        culprit = _node_replacement(err, overrides)
        if culprit is None:
            raise _composition_error(err, config_name, overrides, config_dir, registries) from None
    cfg = _compose(config_name, [o for o in overrides if o != culprit.input_line], config_dir, registries)
    with open_dict(cfg):
        OmegaConf.update(cfg, culprit.key_or_group, culprit.value(), merge=False)
    return cfg


def _node_replacement(err: HydraException, overrides: Sequence[str]) -> Any:
    """The override ``KEY={...}`` that Hydra could not merge into the node at ``KEY`` (a key
    the node lacks), or None. Hydra merges a mapping into a node; a user writing
    ``data_sources.0.dataset='{format: jsonl, path: x.jsonl}'`` means to replace the node, so
    ``_compose`` then composes without that override and sets the node to the mapping whole
    (validation then fills the plugin's defaults). Only what used to be an error changes:
    a mapping whose keys the node has still merges, as in Hydra."""
    cause = err.__cause__
    if not isinstance(cause, ConfigKeyError):
        return None
    culprit = _culprit(getattr(cause, "full_key", "") or "", overrides)
    if culprit is None or culprit.type is not OverrideType.CHANGE or not isinstance(culprit.value(), dict):
        return None
    return culprit


def _parsed(overrides: Sequence[str]) -> list[Any]:
    try:
        return OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return []


def _refuse_split_values(overrides: Sequence[str]) -> None:
    """An override whose list or mapping the shell split at its spaces (``key=[a, b]`` unquoted
    arrives as ``key=[a,`` and ``b]``): name it and the quoted form that works."""
    for i, override in enumerate(overrides):
        depth = sum(override.count(c) for c in "[{") - sum(override.count(c) for c in "]}")
        if "=" not in override or depth <= 0 or i + 1 == len(overrides):
            continue
        pieces = [override]
        for piece in overrides[i + 1:]:
            pieces.append(piece)
            depth += sum(piece.count(c) for c in "[{") - sum(piece.count(c) for c in "]}")
            if depth <= 0:
                break
        key = override.split("=", 1)[0]
        raise ConfigError(key, f"its value was split by the shell at its spaces into {pieces}; quote the "
                               f"whole override: '{' '.join(pieces)}'")


def _refuse_listing_groups(overrides: Sequence[str]) -> None:
    """``data_sources/agent=chat`` cannot place a list entry: say which override does."""
    for override in _parsed(overrides):
        group = PLUGIN_GROUPS.get(override.key_or_group)
        if group is None or group.selectable:
            continue
        field = group.field.replace("[*]", ".0")
        example = f"{field}.{group.name_field}=NAME" if group.name_field else f"{field}=NAME"
        raise ConfigError(
            override.key_or_group,
            f"this group lists the {group.kind} options of {group.field} (see `loongsage config "
            f"show --group {group.group}`) but cannot select one, as {group.field} is "
            f"{'a list entry' if '[*]' in group.field else 'a bare name'}; set it instead, e.g. {example}",
        )


def unknown_recipe_error(config_name: str, config_dir: str | None) -> ConfigError:
    """No recipe ``config_name``: suggest the closest ones (``tiny/grop`` -> ``tiny/grpo``)."""
    recipes = list_recipes() + (list_recipes(Path(config_dir).resolve()) if config_dir else [])
    close = difflib.get_close_matches(config_name, recipes, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    where = f"in {config_dir} or the bundled recipes" if config_dir else "among the bundled recipes"
    return ConfigError("--config-name", f"no recipe {config_name!r} {where}; {hint}"
                                        "`loongsage config recipes` lists them")


def _missing_option_error(err: MissingConfigException, registries: Registries) -> Exception:
    """Turn Hydra's 'no such group option' into UnknownPluginError for plugin groups."""
    group_path, _, option = (err.missing_cfg_file or "").rpartition("/")
    group = PLUGIN_GROUPS.get(group_path)
    if group is None:
        return ConfigError("config", str(err))
    available = {e.name: e.distribution for e in registries[group.kind]}
    return UnknownPluginError(group.kind, option, group.field, available)


def unknown_group_error(name: str, key: str) -> ConfigError:
    """``name`` is no plugin group: suggest the closest group, or the group of a kind name."""
    tree: dict = {}
    for group in PLUGIN_GROUPS:
        node = tree
        for part in group.split("/"):
            node = node.setdefault(part, {})
    path = "/".join(closest_key(tree, name.split("/")) or [])
    by_kind = next((g.group for g in PLUGIN_GROUPS.values() if g.kind == name), None)
    match = by_kind or (path if path in PLUGIN_GROUPS else None)
    hint = f"did you mean {match}? " if match else ""
    return ConfigError(key, f"unknown config group {name!r}; {hint}groups: {', '.join(PLUGIN_GROUPS)}")


def _culprit(full_key: str, overrides: Sequence[str]) -> Any:
    """The parsed override that set ``full_key`` (or a key under it), if one did."""
    parts = split_key(full_key)
    for override in _parsed(overrides):
        mine = split_key(override.key_or_group)
        if mine[: len(parts)] == parts or parts[: len(mine)] == mine:
            return override
    return None


def _existing_keys(config_name: str, overrides: Sequence[str], config_dir: str | None,
                   registries: Registries) -> Any:
    """Plain containers of the config as composed without ``overrides`` failing, for hints."""
    for attempt in (overrides, ()):
        try:
            return OmegaConf.to_container(_hydra_compose(config_name, attempt, config_dir), resolve=False)
        except (HydraException, OmegaConfBaseException):
            continue
    return OmegaConf.to_container(root_schema(registries), resolve=False)


def _composition_error(
    err: HydraException, config_name: str, overrides: Sequence[str], config_dir: str | None,
    registries: Registries,
) -> ConfigError:
    sections = root_schema(registries)
    for override in _parsed(overrides):
        group = override.key_or_group
        if "/" in group and group.split("/")[0] in sections and group not in PLUGIN_GROUPS:
            return unknown_group_error(group, group)
    cause = err.__cause__
    if isinstance(cause, OmegaConfBaseException):
        culprit = _culprit(getattr(cause, "full_key", "") or "", overrides)
        others = [o for o in overrides if culprit is None or o != culprit.input_line]
        tree = _existing_keys(config_name, others, config_dir, registries)
        if culprit is None:
            return omegaconf_error(cause, tree)
        return omegaconf_error(
            cause, tree, key=culprit.key_or_group.replace("/", "."), add_with=f"+{culprit.input_line}"
        )
    return ConfigError("overrides", str(err).splitlines()[0])


def load_config(
    config_name: str,
    overrides: Sequence[str] = (),
    config_dir: str | None = None,
    extra_plugins: Sequence[tuple[object, str]] = (),
    registries: Registries | None = None,
    adjust: Callable[[DictConfig], None] | None = None,
) -> RunConfig:
    """Load the plugins, compose, validate (module docstring); return the resolved config.

    ``registries``: the installed plugins, already loaded (default: load them here).
    ``extra_plugins`` are ``(plugin, name)`` pairs registered for this run only, and
    ``adjust`` changes the composed config before validation (what ``loongsage.train`` does
    with a reward given as a Python callable).
    """
    local = declared_plugins(config_name, overrides, config_dir)
    registries = registries if registries is not None else load_plugins()
    if local or extra_plugins:
        registries = with_plugins(registries, local, extra_plugins)
    _refuse_sections_of_missing_step_terms(config_name, overrides, config_dir, registries)
    publish_plugin_params(registries)
    cfg = _compose(config_name, overrides, config_dir, registries)
    composed = _module_list(cfg.get("plugins"))
    if composed != local:
        raise ConfigError("plugins", f"{composed} came through the recipe's defaults list; name local plugin "
                                     "modules in the recipe file itself or on the command line (plugins=[...]), "
                                     "which are read before composing")
    if adjust is not None:
        with open_dict(cfg):
            adjust(cfg)
    return dataclasses.replace(validate_config(cfg, registries), recipe=config_name, overrides=tuple(overrides))


def _recipe_file(config_name: str, config_dir: str | None) -> Any:
    """The recipe file itself, uncomposed (an empty mapping when there is none)."""
    for root in ([Path(config_dir)] if config_dir else []) + [recipes_dir()]:
        path = root / f"{config_name}.yaml"
        if path.is_file():
            return OmegaConf.load(path) or {}
    return {}


def _refuse_sections_of_missing_step_terms(config_name: str, overrides: Sequence[str], config_dir: str | None,
                                           registries: Registries) -> None:
    """A section that no installed step term owns but a sibling distribution's does (``opd``
    without loongsage-distill; ``algorithm.critic``, nested in a core section, without
    loongsage-algos) is refused with the ``pip install`` that brings it, before Hydra fails on
    it with a key error further down (``catalogue.install_hint``; a step term is registered
    under its section's name, the last part of a nested one)."""
    recipe = _recipe_file(config_name, config_dir)
    given = {(key,) for key in recipe}
    given |= {(key, str(sub)) for key, node in recipe.items() if hasattr(node, "keys") for sub in node.keys()}
    given |= {tuple(o.key_or_group.split(".")[:2]) for o in _parsed(overrides)}
    known = root_schema(registries)
    for path in sorted(given):
        parent = known.get(path[0]) if len(path) == 2 else None
        unknown = path[0] not in known if len(path) == 1 else hasattr(parent, "keys") and path[1] not in parent
        hint = install_hint("step_term", path[-1]) if unknown else ""
        if hint:
            section = ".".join(path)
            raise ConfigError(section, f"unknown section: it belongs to step term {path[-1]!r}.{hint}")


def declared_plugins(config_name: str, overrides: Sequence[str], config_dir: str | None) -> list[str]:
    """The local plugin modules of ``plugins:``, from the recipe's own file and the command line
    (the last override of ``plugins`` wins), without composing."""
    value = _recipe_file(config_name, config_dir).get("plugins")
    for override in _parsed(overrides):
        if override.key_or_group == "plugins":
            value = None if override.is_delete() else override.value()
    return _module_list(value)


def _module_list(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, (list, ListConfig)):
        raise ConfigError("plugins", f"expected a list of importable module names, got {value!r}")
    return [str(m) for m in value]
