"""Checkpoint state of a train engine beyond the HF weights (the embedded and Megatron engines' both).

``save_pretrained`` already writes the weights as safetensors (tied copies once); this
module adds ``train_state.pt`` with the optimizer state, the weight version and the RNG
states, and loads a folder back into a live model + optimizer, bit for bit. A checkpoint of
FSDP2 ranks keeps its optimizer state sharded beside it (``sharded_checkpoint``) and stores
``None`` here; loading it into a model that is not sharded the same way restarts the moments.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn

from loongsage.errors import LoongSageError
from loongsage.models.weight_files import INDEX_FILE, SINGLE_FILE, checkpoint_files

STATE_FILE = "train_state.pt"


def save_train_state(folder: Path, optimizer: torch.optim.Optimizer | None,
                     weight_version: int) -> None:
    state = {
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "weight_version": weight_version,
        "torch_rng": torch.random.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy_rng": np.random.get_state(),
        "python_rng": random.getstate(),
    }
    torch.save(state, folder / STATE_FILE)


def storage_ptr(tensor: torch.Tensor) -> int:
    """Address of the data a tensor holds (an FSDP2 parameter: its local shard's)."""
    return getattr(tensor, "_local_tensor", tensor).data_ptr()


def _tied_names(model: nn.Module) -> set[str]:
    """State-dict names whose storage another (earlier) name already holds."""
    seen: dict[int, str] = {}
    tied = set()
    for name, tensor in model.state_dict().items():
        ptr = storage_ptr(tensor)
        if ptr in seen:
            tied.add(name)
        seen.setdefault(ptr, name)
    return tied


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of ``folder``'s model (``models.weight_files.checkpoint_files``: the shards its
    index maps, else ``model.safetensors``; never an adapter or a second copy beside them), by HF
    name. Raises ``LoongSageError`` naming the folder when it has neither or a mapped shard is
    missing."""
    files = checkpoint_files(folder)
    if not files:
        raise LoongSageError(f"{folder}: no model weights to load (expected {INDEX_FILE} and the "
                             f"shards it maps, or {SINGLE_FILE}; other *.safetensors files, such "
                             "as an adapter, are not read)")
    absent = [f.name for f in files if not f.is_file()]
    if absent:
        raise LoongSageError(f"{folder}: {INDEX_FILE} maps shards that are not there: {absent[:5]}")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(str(f)))
    return weights


def check_loaded(folder: Path, model: nn.Module, missing: list[str], unexpected: list[str]) -> None:
    """Refuse a partial load: names missing (beyond tied copies) or unexpected."""
    missing = sorted(set(missing) - _tied_names(model))
    if missing or unexpected:
        raise LoongSageError(
            f"{folder}: weights do not match the model (missing {missing[:5]}, "
            f"unexpected {sorted(unexpected)[:5]})"
        )


def load_weights(folder: Path, model: nn.Module) -> None:
    """Copy the tensors of ``folder``'s model (``read_weights``) into ``model`` (strict, tied-aware)."""
    missing, unexpected = model.load_state_dict(read_weights(folder), strict=False)
    check_loaded(folder, model, missing, unexpected)


def restore_train_state(folder: Path, optimizer: torch.optim.Optimizer | None) -> int:
    """RNG states, and the optimizer's when saved and ``optimizer`` is given; return the version."""
    path = folder / STATE_FILE
    if not path.is_file():
        return 0
    state = torch.load(path, map_location="cpu", weights_only=False)
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    elif optimizer is not None:
        print(f"{folder}: the optimizer state was written as FSDP2 shards, which this run does "
              "not load (another train.strategy or train.dp_size); AdamW moments restart",
              flush=True)
    torch.random.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    np.random.set_state(state["numpy_rng"])
    random.setstate(state["python_rng"])
    return int(state["weight_version"])


def load_train_state(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load weights and, when present, optimizer and RNG state; return the weight version."""
    load_weights(folder, model)
    return restore_train_state(folder, optimizer)
