"""A deterministic tiny Qwen2 (≈3.4 M parameters) for fast tests and the tiny recipe.

Architecture: hidden 256, intermediate 768, 4 layers, 4 heads,
2 KV heads, tied embeddings, vocabulary = the locally trained tokenizer's size (no padding
rows, so a sampler can never emit an id the tokenizer cannot decode). Weights come from
``torch.manual_seed(seed)`` and HF's own initialisation, so the same seed gives the same
bytes. The folder is a normal HF checkpoint: ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load it without LoongSage.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

from loongsage.models.cache import build_once
from loongsage.models.tiny_tokenizer import train_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

TINY_ARCH = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)


def save_seeded_model(out_dir: str | Path, make_model: Callable[..., "PreTrainedModel"],
                      config_cls: type, arch: dict, seed: int = 0) -> Path:
    """Write ``make_model(config)`` (weights from ``torch.manual_seed(seed)``) + the tiny tokenizer
    to ``out_dir``; ``config_cls(**arch)`` gets the tokenizer's vocabulary and special ids."""
    from transformers import GenerationConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = config_cls(
        vocab_size=len(tokenizer),
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
        dtype="float32",
        **arch,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = make_model(config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad, bos_token_id=pad)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_tiny_model(out_dir: str | Path, seed: int = 0) -> Path:
    """Write the tiny model + tokenizer to ``out_dir`` (created; files overwritten)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return save_seeded_model(out_dir, Qwen2ForCausalLM, Qwen2Config, TINY_ARCH, seed)


def source_hash(seed: int, module: str = "tiny.py") -> str:
    """Changes whenever the recipe for a tiny model (``module``, the shared builders, or
    library versions) changes."""
    import tokenizers
    import transformers

    here = Path(__file__).parent
    versions = f"{seed}|{torch.__version__}|{transformers.__version__}|{tokenizers.__version__}"
    h = hashlib.sha256(versions.encode())
    for name in sorted({module, "tiny.py", "tiny_tokenizer.py", "chatml.py"}):
        h.update((here / name).read_bytes())
    return h.hexdigest()[:16]


def default_cache_root() -> Path:
    """``$LOONGSAGE_CACHE`` or ``~/.cache/loongsage``."""
    return Path(os.environ.get("LOONGSAGE_CACHE", Path.home() / ".cache" / "loongsage"))


def ensure_tiny_model(cache_dir: str | Path | None = None, seed: int = 0) -> Path:
    """Build the tiny model once into a content-addressed cache folder and reuse it.

    Concurrent callers are safe: each builds into a private temporary folder and the first
    to finish renames it into place.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    final = root / f"tiny-qwen2-{source_hash(seed)}"
    if (final / "config.json").exists():
        return final
    return build_once(final, lambda tmp: build_tiny_model(tmp, seed=seed))
