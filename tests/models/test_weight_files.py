"""Which safetensors files make up a folder's model (``loongsage.models.weight_files``), and the
train engines' ``read_weights`` reading exactly those: the shards the index maps, else
``model.safetensors``, never an adapter or a second copy left beside them."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import save_file

from loongsage.engines.embedded_train import load_causal_lm
from loongsage.engines.train_state import load_weights, read_weights
from loongsage.errors import LoongSageError
from loongsage.models.weight_files import checkpoint_files

STRAY = "base_model.model.lm_head.lora_A.weight"


def _stray_adapter(folder) -> None:
    """An adapter file beside the weights, with a tensor the model does not have."""
    save_file({STRAY: torch.zeros(2, 2)}, str(folder / "adapter_model.safetensors"))


def test_shards_of_the_index_and_nothing_beside_them(tiny_model_dir, tmp_path):
    model = load_causal_lm(tiny_model_dir, "float32")
    model.save_pretrained(tmp_path, max_shard_size="1MB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 1
    _stray_adapter(tmp_path)
    shutil.copy(tiny_model_dir / "model.safetensors", tmp_path / "model.safetensors")  # a stray copy
    assert checkpoint_files(tmp_path) == shards
    weights = read_weights(tmp_path)
    assert STRAY not in weights
    saved = model.state_dict()
    assert set(weights) <= set(saved) and all(torch.equal(weights[k], saved[k]) for k in weights)
    fresh = load_causal_lm(tiny_model_dir, "float32")
    load_weights(tmp_path, fresh)  # strict: an adapter tensor read too would be unexpected


def test_a_single_file_model_ignores_an_adapter(tiny_model_dir, tmp_path):
    shutil.copy(tiny_model_dir / "model.safetensors", tmp_path / "model.safetensors")
    _stray_adapter(tmp_path)
    assert checkpoint_files(tmp_path) == [tmp_path / "model.safetensors"]
    assert STRAY not in read_weights(tmp_path)


def test_a_folder_without_model_weights_is_refused(tmp_path):
    """An adapter alone is not a model: the error names the folder and the files expected."""
    assert checkpoint_files(tmp_path) == []
    _stray_adapter(tmp_path)
    assert checkpoint_files(tmp_path) == []
    with pytest.raises(LoongSageError, match="model.safetensors") as err:
        read_weights(tmp_path)
    assert str(tmp_path) in str(err.value) and "model.safetensors.index.json" in str(err.value)


def test_a_shard_the_index_maps_but_lacks_is_refused(tiny_model_dir, tmp_path):
    load_causal_lm(tiny_model_dir, "float32").save_pretrained(tmp_path, max_shard_size="1MB")
    gone = max(tmp_path.glob("model-*.safetensors"))
    gone.unlink()
    with pytest.raises(LoongSageError, match=gone.name):
        read_weights(tmp_path)
