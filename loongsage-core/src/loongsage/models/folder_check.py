"""A model folder opened cheaply before the run starts: config, the weights' headers, tokenizer.

Without it a broken folder failed late and far from its cause: a folder without its tokenizer
files started the run (the memory estimate saw "one 0-token prompt") and failed at
``/generate`` (``input_ids[0]: expected a non-empty list of token ids, got []``); truncated or
missing weights died inside the train actor with a raw traceback naming no path.

``check_model_folder`` reads ``config.json``, the header of every weights file the model loads
(``weight_files.checkpoint_files``: a safetensors file starts with an 8-byte header length and
a JSON header whose tensors' ``data_offsets`` say how long the file must be, so a truncated
file is found without reading its tensors), and asks the tokenizer to encode a probe text.
Every error names the file and what is wrong with it.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from loongsage.errors import ConfigError
from loongsage.models.weight_files import INDEX_FILE, SINGLE_FILE, checkpoint_files

PROBE = "Hello, world."


def _fail(problem: str) -> ConfigError:
    return ConfigError("model.path", problem)


def check_weights_file(path: Path) -> None:
    """``ConfigError`` when ``path`` is missing, not safetensors, or shorter than its header says."""
    if not path.is_file():
        raise _fail(f"{path} is missing (the model's weights)")
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise _fail(f"{path} has {size} bytes: too short for a safetensors file (truncated?)")
        length = struct.unpack("<Q", head)[0]
        if 8 + length > size:
            raise _fail(f"{path}: its header says {length} bytes of header, the file has {size} (truncated "
                        "or not a safetensors file)")
        try:
            header = json.loads(handle.read(length))
        except ValueError as err:
            raise _fail(f"{path}: unreadable safetensors header ({err})") from None
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + length + end > size:
        raise _fail(f"{path} has {size} bytes, its header needs {8 + length + end} (truncated)")


def check_model_folder(folder: Path, tokenizer: Any) -> None:
    """Config, weights' headers and tokenizer of ``folder`` (see the module docstring)."""
    config = folder / "config.json"
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise _fail(f"{config} is unreadable ({type(err).__name__}: {err})") from None
    files = checkpoint_files(folder)
    if not files:
        raise _fail(f"{folder} holds no weights: neither {SINGLE_FILE} nor {INDEX_FILE}")
    for path in files:
        check_weights_file(path)
    try:
        ids = tokenizer(PROBE)["input_ids"]
    except Exception as err:  # whatever the tokenizer raises, named
        raise _fail(f"the tokenizer of {folder} cannot encode text ({type(err).__name__}: {err})") from None
    if not ids:
        raise _fail(f"the tokenizer of {folder} encodes {PROBE!r} to no tokens: its vocabulary files "
                    "(tokenizer.json, or vocab and merges) are missing; copy them from the base model "
                    "or set model.tokenizer_path")
