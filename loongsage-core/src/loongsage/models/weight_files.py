"""Which ``*.safetensors`` files of a Hugging Face folder hold its model's weights.

The shards ``model.safetensors.index.json`` maps when the folder has that index, else
``model.safetensors``, as ``transformers`` loads a folder: never every ``*.safetensors`` file in
it, since a folder may also hold a LoRA adapter (``adapter_model.safetensors``) or a second,
consolidated copy of the weights beside the shards, and reading those too double-counts the
parameters or loads tensors the model does not have. The start-up memory estimate (counting
parameters from the headers) and the train engines (loading a checkpoint) both decide it here,
so they read the same files. The project's own checkpoints fit: ``save_pretrained`` writes
``model.safetensors`` or index + shards, the Megatron export ``model.safetensors``, and a LoRA
checkpoint's adapter is loaded on its own (``engines.lora``). Importing this does not import torch.
"""

from __future__ import annotations

import json
from pathlib import Path

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def checkpoint_files(folder: str | Path) -> list[Path]:
    """The safetensors files of ``folder``'s model: the shards its ``model.safetensors.index.json``
    maps (each once, sorted), else ``model.safetensors``; an empty list when it has neither.
    The shards are listed as the index names them, whether or not they exist."""
    root = Path(folder)
    index = root / INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return [root / name for name in sorted(set(weight_map.values()))]
    single = root / SINGLE_FILE
    return [single] if single.is_file() else []
