"""Checkpoints of the megatron engine: a Megatron distributed checkpoint for resume, plus HF.

A folder written by ``save`` holds

* ``megatron/``: the model as a Megatron-Core distributed checkpoint
  (``dist_checkpointing.save`` of ``GPTModel.sharded_state_dict()``: every rank writes its
  own shards, and the metadata lets another TP/PP layout read them back) and
  ``megatron/layout.json``, the TP/PP/DP sizes that wrote it;
* ``megatron_optimizer/rank_<r>.pt``: each rank's AdamW state for its own parameters (a
  torch optimizer, not Megatron's, see ``engine``), beside (not inside) the distributed
  checkpoint, whose folder must be empty before ``dist_checkpointing.save`` writes it;
* the Hugging Face export (safetensors in HF names and layouts, ``config.json``, the
  tokenizer), which ``transformers`` and the embedded engine load as they are;
* ``train_state.pt`` with the weight version and RNG states (``train_state``).

``load`` with the same layout restores weights and AdamW moments exactly; with another
layout the weights still load from the distributed checkpoint and the moments restart
(said on stdout); a folder without ``megatron/`` (an embedded engine's checkpoint, a HF
folder) loads its HF weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from loongsage.engines.train_state import restore_train_state, save_train_state

MEGATRON = "megatron"
OPTIMIZER = "megatron_optimizer"
META = "layout.json"


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def _layout(engine: Any) -> dict[str, int]:
    layout = engine.layout
    return {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp}


def save_checkpoint(engine: Any, folder: Path) -> None:
    """Every rank writes its shards and optimizer state; rank 0 the HF export (a collective)."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from safetensors.torch import save_file

    shards = folder / MEGATRON
    if _rank() == 0:
        shards.mkdir(parents=True, exist_ok=True)
        (folder / OPTIMIZER).mkdir(exist_ok=True)
    dist.barrier()
    hf = {name: t.contiguous() for name, t in engine.named_tensors(include_tied=False)}
    dist_checkpointing.save(engine.model.sharded_state_dict(), str(shards))
    torch.save({"optimizer": engine.optimizer.state_dict(), "layout": _layout(engine)},
               folder / OPTIMIZER / f"rank_{_rank()}.pt")
    if _rank() == 0:
        save_file(hf, str(folder / "model.safetensors"), metadata={"format": "pt"})
        engine.hf_config.save_pretrained(folder)
        engine.tokenizer.save_pretrained(folder)
        save_train_state(folder, None, engine.weight_version)
        (shards / META).write_text(json.dumps(_layout(engine)), encoding="utf-8")
    dist.barrier()


def load_checkpoint(engine: Any, folder: Path) -> int:
    """Restore what ``save_checkpoint`` wrote (every rank calls it); return the version."""
    from megatron.core import dist_checkpointing

    shards = folder / MEGATRON
    if not (shards / META).is_file():
        engine.model = engine._build(folder)
        engine.reset_optimizer()
        return restore_train_state(folder, None)
    state = dist_checkpointing.load(engine.model.sharded_state_dict(), str(shards))
    engine.model.load_state_dict(state, strict=False)
    engine.reset_optimizer()
    saved = json.loads((shards / META).read_text(encoding="utf-8"))
    own = folder / OPTIMIZER / f"rank_{_rank()}.pt"
    if saved == _layout(engine) and own.is_file():
        engine.optimizer.load_state_dict(torch.load(own, map_location="cpu", weights_only=False)["optimizer"])
    else:
        print(f"{folder}: written by layout {saved}, loading into {_layout(engine)}; the weights "
              "are resharded, AdamW moments restart", flush=True)
    return restore_train_state(folder, None)
