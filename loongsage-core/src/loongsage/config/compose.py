"""Compose a run configuration from recipes with Hydra, then validate it.

``load_config`` is the only way a command gets its config: it loads the plugins and
publishes their parameter groups to the ConfigStore, composes the recipe with Hydra, loads
the local plugin modules the recipe names (and composes again if there are any), and
validates the result before anything starts, returning the ``RunConfig`` with every plugin
resolved.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf

from loongsage.config.store import PLUGIN_GROUPS, publish_plugin_params
from loongsage.config.validate import RunConfig, validate_config
from loongsage.errors import ConfigError, UnknownPluginError
from loongsage.plugins import load_plugins
from loongsage.registry import Registries


def recipes_dir() -> Path:
    """The folder of bundled recipes: ``$LOONGSAGE_RECIPES_DIR``, else the repository's."""
    env = os.environ.get("LOONGSAGE_RECIPES_DIR")
    if env:
        return Path(env).resolve()
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "recipes"
        if candidate.is_dir() and any(candidate.rglob("*.yaml")):
            return candidate
    return (Path.cwd() / "recipes").resolve()


def list_recipes(root: Path | None = None) -> list[str]:
    """Every recipe name under ``root`` (``tiny/grpo``, ...), for listing and tests."""
    root = root or recipes_dir()
    return sorted(
        str(p.relative_to(root).with_suffix(""))
        for p in root.rglob("*.yaml")
        if not p.name.startswith("_")
    )


def _compose(config_name: str, overrides: Sequence[str], config_dir: str | None,
             registries: Registries) -> DictConfig:
    bundled = recipes_dir()
    primary = Path(config_dir).resolve() if config_dir else bundled
    extra = [f"hydra.searchpath=[file://{bundled}]"] if config_dir else []
    try:
        with initialize_config_dir(version_base=None, config_dir=str(primary)):
            cfg = compose(config_name=config_name, overrides=[*overrides, *extra])
    except MissingConfigException as err:
        raise _missing_option_error(err, overrides, registries) from None
    except HydraException as err:
        raise ConfigError("overrides", str(err)) from None
    cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]) if "hydra" in cfg else cfg
    return cfg


def _missing_option_error(err: MissingConfigException, overrides: Sequence[str],
                          registries: Registries) -> Exception:
    """Turn Hydra's 'no such group option' into UnknownPluginError for plugin groups."""
    for override in overrides:
        group, _, option = override.lstrip("+~").partition("=")
        for kind, plugin_group in PLUGIN_GROUPS.items():
            if group == plugin_group and option not in registries[kind]:
                key = plugin_group.replace("/", ".")
                return UnknownPluginError(
                    kind, option, key, {e.name: e.distribution for e in registries[kind]}
                )
    return ConfigError("config", str(err))


def load_config(
    config_name: str,
    overrides: Sequence[str] = (),
    config_dir: str | None = None,
) -> RunConfig:
    """Compose, load the plugins the recipe names, validate; return the resolved config."""
    registries = load_plugins()
    publish_plugin_params(registries)
    cfg = _compose(config_name, overrides, config_dir, registries)
    local = [str(m) for m in cfg.get("plugins", []) or []]
    if local:
        registries = load_plugins(local)
        publish_plugin_params(registries)
        cfg = _compose(config_name, overrides, config_dir, registries)
    return validate_config(cfg, registries)
