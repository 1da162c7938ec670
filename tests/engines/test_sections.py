"""``engines.sections``: the config reader every train-side engine builds itself with."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from loongsage.engines.sections import config_section, train_section
from loongsage.errors import ConfigError
from loongsage.schema import LoraSettings, ModelConfig, TrainConfig


def test_a_section_is_its_dataclass_with_defaults_from_a_dict_or_a_node():
    for cfg in ({"model": {"path": "tiny", "dtype": "bfloat16"}},
                OmegaConf.create({"model": {"path": "tiny", "dtype": "bfloat16"}})):
        model = config_section(cfg, "model", ModelConfig)
        assert (model.path, model.dtype, model.fp32_lm_head) == ("tiny", "bfloat16", True)


def test_an_unknown_key_names_the_section():
    with pytest.raises(ConfigError, match=r"^model: does not match ModelConfig: .*'dtpye'"):
        config_section({"model": {"path": "tiny", "dtpye": "float32"}}, "model", ModelConfig)


def test_train_section_types_its_nested_sections():
    train = train_section({"train": {"lr": 3e-4, "lora": {"rank": 4}}})
    assert isinstance(train, TrainConfig) and train.lr == 3e-4
    assert isinstance(train.lora, LoraSettings) and (train.lora.rank, train.lora.alpha) == (4, 16.0)
    with pytest.raises(ConfigError, match=r"^train.lora: does not match LoraSettings"):
        train_section({"train": {"lora": {"rnak": 4}}})
