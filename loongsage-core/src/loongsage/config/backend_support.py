"""What a train backend implements, and the packages it needs, checked at validation.

**Keys.** A train engine plugin declares ``implemented_keys``: the backend keys
(``BACKEND_KEYS``: every key of the ``train`` section, ``train.megatron`` and ``train.lora``
as one key each, and ``trainer.router_replay``) it reads. Any other backend key set away from
its schema default is refused naming the key and the backend: accepted, it would be silently
ignored (``train.backend=megatron`` with ``train.gradient_checkpointing=true``, which the
memory refusal itself recommends, trained without it). An engine plugin without the
attribute (a third-party one) is not checked.

**Packages.** Optional dependencies of the configured backend and features
(``OPTIONAL_PACKAGES``: megatron-core for ``train.backend=megatron``, peft for LoRA) are
looked up with ``importlib.util.find_spec`` (nothing is imported), so a missing one stops the
run at validation with the ``pip install`` that fixes it, not inside an actor after a
SIGABRT stack dump.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from omegaconf import DictConfig, OmegaConf

from loongsage.errors import ConfigError
from loongsage.install_hints import extra_command

if TYPE_CHECKING:
    from loongsage.registry import PluginRef

SECTION_KEYS = ("train.megatron", "train.lora")  # checked whole: a backend takes all of it or none
EXTRA_KEYS = ("trainer.router_replay",)


def backend_keys() -> list[str]:
    """Every backend key of the schema (see the module docstring)."""
    from loongsage.config.store import root_schema

    train = root_schema().train
    keys = [f"train.{k}" for k in train if f"train.{k}" not in SECTION_KEYS]
    return sorted([*keys, *SECTION_KEYS, *EXTRA_KEYS])


def check_backend_keys(cfg: DictConfig, engine: Any) -> None:
    """``ConfigError`` for the first backend key ``engine`` does not implement that ``cfg`` sets."""
    from loongsage.config.store import root_schema

    implemented = getattr(engine, "implemented_keys", None)
    if implemented is None:
        return
    defaults = root_schema()
    for key in backend_keys():
        if key in implemented or key == "train.backend":
            continue
        value, default = OmegaConf.select(cfg, key), OmegaConf.select(defaults, key)
        if value != default:
            raise ConfigError(key, f"train.backend={cfg.train.backend} does not implement it, so {_plain(value)!r} "
                              f"would be ignored; leave it at its default ({_plain(default)!r}) or use a "
                              "backend that implements it")


@dataclass(frozen=True)
class OptionalPackage:
    """A package a feature needs: the module to find, its pip extra, and when it is needed."""

    key: str  # the config key that asks for it
    module: str
    extra: str  # the extra of loongsage-core that brings it (its hint installs what the extra adds)
    needed: Callable[[DictConfig], bool]


OPTIONAL_PACKAGES = (
    OptionalPackage("train.backend", "megatron.core", "megatron", lambda cfg: cfg.train.backend == "megatron"),
    OptionalPackage("train.lora.rank", "peft", "lora", lambda cfg: cfg.train.lora.rank > 0),
)


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package, or a module set to None
        return False


def check_optional_packages(cfg: DictConfig) -> None:
    """``ConfigError`` naming the first package the configured features need and lack."""
    for package in OPTIONAL_PACKAGES:
        if package.needed(cfg) and not installed(package.module):
            raise ConfigError(package.key, f"{package.key}={_plain(OmegaConf.select(cfg, package.key))} needs "
                              f"the {package.module!r} package, which is not installed: "
                              f"{extra_command('loongsage-core', package.extra)}")


def check_environment_library(env: PluginRef) -> None:
    """``ConfigError`` naming the extra to install when an environment's library is missing (the
    ``requires = (module, distribution, extra)`` its parameter dataclass declares)."""
    requires = env.trait("requires")
    if requires and not installed(requires[0]):
        module, distribution, extra = requires
        raise ConfigError(f"{env.key}.type", f"environment '{env.name}' needs the {module!r} library, "
                          f"which is not installed; install the extra [{extra}] of {distribution}: "
                          f"{extra_command(distribution, extra)}")


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
