"""Backend keys and optional packages checked at validation (``loongsage.config.backend_support``).

Before, ``train.backend=megatron`` accepted ``trainer.router_replay``,
``train.gradient_checkpointing``, ``train.max_tokens_per_micro_batch`` and ``train.strategy`` and
ignored them; a missing megatron-core or peft was reported from inside the actor after a
SIGABRT stack dump. The tables are tested by enumerating every backend key of the schema.
"""

from __future__ import annotations

import sys

import pytest
from omegaconf import OmegaConf

from loongsage.config.backend_support import backend_keys, check_backend_keys
from loongsage.config.store import root_schema
from loongsage.config.validate import validate_config
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.engines.megatron.engine import MegatronTrainEngine
from loongsage.errors import ConfigError
from loongsage.plugins import get_registries

BACKENDS = {"embedded_train": EmbeddedTrainEngine, "megatron": MegatronTrainEngine}
OTHER_VALUE = {"train.strategy": "fsdp2", "trainer.router_replay": "rollout", "train.betas": [0.8, 0.95],
               "train.megatron": {"tp": 2}, "train.lora": {"rank": 8}}


def other_value(key, default):
    """A value of ``key`` away from its default."""
    if key in OTHER_VALUE:
        return OTHER_VALUE[key]
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 3
    if isinstance(default, float):
        return default * 2 + 0.5
    raise AssertionError(f"no other value for {key} (default {default!r}): add one to OTHER_VALUE")


def test_the_backend_keys_are_the_schema_s():
    keys = backend_keys()
    assert {"train.lr", "train.strategy", "train.gradient_checkpointing", "train.megatron", "train.lora",
            "trainer.router_replay"} <= set(keys)
    assert not any(k.startswith(("train.megatron.", "train.lora.")) for k in keys)
    for engine in BACKENDS.values():
        assert engine.implemented_keys <= set(keys), engine.implemented_keys - set(keys)  # no stale entry


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_every_backend_key_is_implemented_or_refused(backend):
    engine, defaults = BACKENDS[backend], root_schema()
    refused = []
    for key in backend_keys():
        if key == "train.backend":
            continue
        cfg = root_schema()
        cfg.train.backend = backend
        OmegaConf.update(cfg, key, other_value(key, OmegaConf.select(defaults, key)), merge=True)
        try:
            check_backend_keys(cfg, engine)
        except ConfigError as err:
            assert err.key == key and f"train.backend={backend} does not implement it" in err.problem
            refused.append(key)
        else:
            assert key in engine.implemented_keys, key
    assert sorted(refused) == sorted(set(backend_keys()) - engine.implemented_keys - {"train.backend"})
    if backend == "megatron":
        assert {"trainer.router_replay", "train.gradient_checkpointing", "train.max_tokens_per_micro_batch",
                "train.strategy"} <= set(refused)
    else:
        assert refused == ["train.megatron"]


def config(**train_and_trainer):
    cfg = {"model": {"path": "unused"}, "data_sources": [
        {"name": "p", "dataset": {"format": "synthetic_math", "size": 8}, "reward": {"name": "math"}}]}
    for key, value in train_and_trainer.items():
        section, _, name = key.partition("__")
        cfg.setdefault(section, {})[name] = value
    return OmegaConf.create(cfg)


@pytest.mark.parametrize("key, value", [("trainer__router_replay", "rollout"),
                                        ("train__gradient_checkpointing", True),
                                        ("train__max_tokens_per_micro_batch", 4096),
                                        ("train__strategy", "fsdp2")])
def test_megatron_refuses_the_keys_it_ignored(key, value):
    with pytest.raises(ConfigError) as err:
        validate_config(config(train__backend="megatron", **{key: value}), get_registries())
    name = key.replace("__", ".")
    assert str(err.value) == (f"{name}: train.backend=megatron does not implement it, so {value!r} would be "
                              f"ignored; leave it at its default ({OmegaConf.select(root_schema(), name)!r}) "
                              "or use a backend that implements it")
    validate_config(config(**{key: value}), get_registries())  # the embedded backend takes each


@pytest.mark.parametrize("module, overrides, message", [
    ("megatron.core", {"train__backend": "megatron"},
     "train.backend: train.backend=megatron needs the 'megatron.core' package, which is not installed: "
     "pip install 'megatron-core==0.16.1'"),
    ("peft", {"train__lora": {"rank": 8}},
     "train.lora.rank: train.lora.rank=8 needs the 'peft' package, which is not installed: "
     "pip install 'peft==0.21.2'"),
])
def test_a_missing_optional_package_is_named_at_validation(module, overrides, message, monkeypatch):
    validate_config(config(**overrides), get_registries())  # installed here
    monkeypatch.setitem(sys.modules, module, None)  # as if it were not
    with pytest.raises(ConfigError) as err:
        validate_config(config(**overrides), get_registries())
    assert str(err.value) == message
