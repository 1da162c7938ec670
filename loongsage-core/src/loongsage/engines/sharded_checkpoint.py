"""Checkpoints of FSDP2 train ranks: sharded state for an exact resume, plus the HF export.

A checkpoint folder written by ``train.strategy=fsdp2`` holds

* ``sharded/``: model and optimizer state as ``torch.distributed.checkpoint`` shards, one
  per rank, and ``sharded/meta.json`` with the number of ranks that wrote them;
* the Hugging Face export (``model.safetensors``, config, tokenizer) gathered on rank 0
  (``get_model_state_dict(full_state_dict=True, cpu_offload=True)``), the same files a
  single-process run writes, so any run can start from it;
* ``train_state.pt`` with the weight version and RNG states (optimizer: ``None``).

Resuming with the same ``train.dp_size`` loads the shards (weights and AdamW moments, exactly).
With another ``dp_size`` (or strategy) the weights come from the HF export and the AdamW
moments restart: the shards are not re-partitioned here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loongsage.engines.train_state import (
    check_loaded,
    read_weights,
    restore_train_state,
    save_train_state,
)

SHARDED = "sharded"
META = "meta.json"


def save_sharded(engine: Any, folder: Path, rank: int, world_size: int) -> None:
    """Every rank writes its shards; rank 0 also the HF export and ``train_state.pt``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
    )

    model_state, optim_state = get_state_dict(engine.model, engine.optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(folder / SHARDED))
    full = get_model_state_dict(
        engine.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        engine.model.save_pretrained(folder, state_dict=full)
        engine.tokenizer.save_pretrained(folder)
        save_train_state(folder, None, engine.weight_version)
        meta = {"strategy": "fsdp2", "world_size": world_size}
        (folder / SHARDED / META).write_text(json.dumps(meta), encoding="utf-8")


def sharded_world_size(folder: Path) -> int | None:
    """The number of ranks whose shards ``folder`` holds, or None without shards."""
    path = folder / SHARDED / META
    return json.loads(path.read_text(encoding="utf-8"))["world_size"] if path.is_file() else None


def load_sharded(engine: Any, folder: Path, world_size: int) -> int:
    """Restore a checkpoint into FSDP2 ranks (every rank calls this); return the version."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    if sharded_world_size(folder) == world_size:
        model_state, optim_state = get_state_dict(engine.model, engine.optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        dcp.load(state, checkpoint_id=str(folder / SHARDED))
        set_state_dict(engine.model, engine.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        return restore_train_state(folder, None)
    options = StateDictOptions(full_state_dict=True, strict=False)
    missing, unexpected = set_model_state_dict(engine.model, read_weights(folder), options=options)
    check_loaded(folder, engine.model, list(missing), list(unexpected))
    print(f"{folder}: loaded the HF export into {world_size} FSDP2 ranks (the shards, if any, "
          f"were written by {sharded_world_size(folder)}); AdamW moments restart", flush=True)
    return restore_train_state(folder, None)
