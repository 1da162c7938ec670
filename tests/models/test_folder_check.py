"""A model folder opened cheaply before the run starts (``loongsage.models.folder_check``).

Copies of the real tiny model folder, broken as a user breaks them: no tokenizer files,
truncated or missing weights, a damaged config, a shard its index maps gone. Before, the
folder without a tokenizer started the run and failed at ``/generate`` (``input_ids[0]:
expected a non-empty list of token ids, got []``); broken weights died inside the train actor
with a raw traceback naming no path.
"""

from __future__ import annotations

import json
import shutil

import pytest
from transformers import AutoTokenizer

from loongsage.errors import ConfigError
from loongsage.models.folder_check import check_model_folder


@pytest.fixture
def folder(tmp_path, tiny_model_dir):
    copy = tmp_path / "model"
    shutil.copytree(tiny_model_dir, copy)
    return copy


def check(folder):
    check_model_folder(folder, AutoTokenizer.from_pretrained(folder))


def test_the_intact_folder_passes(folder):
    check(folder)


def test_a_folder_without_its_tokenizer_files_is_refused(folder):
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ConfigError) as err:
        check(folder)
    assert str(err.value) == (f"model.path: the tokenizer of {folder} encodes 'Hello, world.' to no tokens: its "
                              "vocabulary files (tokenizer.json, or vocab and merges) are missing; copy them from "
                              "the base model or set model.tokenizer_path")


def test_truncated_weights_are_named(folder):
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: size // 2])
    with pytest.raises(ConfigError) as err:
        check(folder)
    assert str(err.value).startswith(f"model.path: {weights} has {size // 2} bytes, its header needs {size} "
                                     "(truncated)")


def test_a_cut_header_and_missing_weights_are_named(folder):
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ConfigError, match=r"its header says \d+ bytes of header, the file has 100"):
        check(folder)
    weights.unlink()
    with pytest.raises(ConfigError, match=rf"^model.path: {folder} holds no weights: neither model.safetensors "
                                          r"nor model.safetensors.index.json$"):
        check(folder)


def test_a_shard_the_index_maps_that_is_gone_is_named(folder):
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(ConfigError, match=r"model-00002-of-00002.safetensors is missing \(the model's weights\)$"):
        check(folder)


def test_a_damaged_config_is_named(folder):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    (folder / "config.json").write_text('{"model_type": "qwen2", ')
    with pytest.raises(ConfigError, match=rf"^model.path: {folder / 'config.json'} is unreadable \(JSONDecodeError"):
        check_model_folder(folder, tokenizer)
