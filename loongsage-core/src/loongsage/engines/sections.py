"""An engine's typed config sections, read from the config it is built from.

Every train-side engine (the embedded trainer, Megatron, a plugin's value model) is built by
``from_config(cfg)`` from the run's resolved config, as a dict or an OmegaConf node, and reads
its sections as the schema's dataclasses with their defaults. This is the one reader they
share, so none of them imports another engine for it.
"""

from __future__ import annotations

from typing import Any, Mapping

from loongsage.errors import ConfigError
from loongsage.schema import LoraSettings, MegatronSettings, TrainConfig


def config_section(cfg: Any, name: str, schema: type) -> Any:
    """``cfg[name]`` (dict or DictConfig) as the schema dataclass, defaults filled in; a key the
    schema does not have raises ``ConfigError`` naming the section."""
    from omegaconf import DictConfig, OmegaConf

    node = cfg.get(name) if cfg is not None else None
    if isinstance(node, DictConfig):
        values = OmegaConf.to_container(node, resolve=True)
    else:
        values = dict(node or {})
    try:
        return schema(**values)
    except TypeError as err:
        raise ConfigError(name, f"does not match {schema.__name__}: {err}") from None


def train_section(cfg: Any) -> TrainConfig:
    """``cfg["train"]`` as a ``TrainConfig``, its nested sections (``lora``, ``megatron``) as
    their dataclasses too (they arrive as plain dicts)."""
    train = config_section(cfg, "train", TrainConfig)
    if isinstance(train.lora, Mapping):
        train.lora = config_section({"train.lora": train.lora}, "train.lora", LoraSettings)
    if isinstance(train.megatron, Mapping):
        train.megatron = config_section({"train.megatron": train.megatron}, "train.megatron", MegatronSettings)
    return train
