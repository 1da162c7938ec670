"""Tiny Llama-family and MoE checkpoints for the megatron engine's tests.

Each is a random-initialised HF model (seeded, a few hundred kB) saved with the tiny
model's tokenizer, one per layout the conversion must handle: Llama with untied embeddings
(SmolLM2's family), Qwen3 with q/k norms, and Qwen3-MoE (routed experts, top-2 of 4).
These live here, not in ``loongsage.models``, because only these tests use them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6)


def _save(config, out: Path, tokenizer_dir: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    state = torch.random.get_rng_state()
    torch.manual_seed(0)
    try:
        model = AutoModelForCausalLM.from_config(config)
        with torch.no_grad():  # wider than HF's 0.02 init, so layout mistakes show in logits
            for param in model.parameters():
                if param.dim() > 1:
                    param.normal_(0, 0.1)
                else:
                    param.uniform_(0.5, 1.5)
    finally:
        torch.random.set_rng_state(state)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_family(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    """``{"qwen2": the tiny model, "llama": ..., "qwen3": ..., "qwen3_moe": ...}`` folders."""
    from transformers import LlamaConfig, Qwen3Config, Qwen3MoeConfig

    root = tmp_path_factory.mktemp("megatron_models")
    vocab = len(__import__("transformers").AutoTokenizer.from_pretrained(tiny_model_dir))
    return {
        "qwen2": Path(tiny_model_dir),
        "llama": _save(LlamaConfig(vocab_size=vocab, tie_word_embeddings=False, **COMMON),
                       root / "llama", tiny_model_dir),
        "qwen3": _save(Qwen3Config(vocab_size=vocab, head_dim=16, tie_word_embeddings=True, **COMMON),
                       root / "qwen3", tiny_model_dir),
        "qwen3_moe": _save(Qwen3MoeConfig(vocab_size=vocab, head_dim=16, num_experts=4,
                                          num_experts_per_tok=2, moe_intermediate_size=32,
                                          norm_topk_prob=True, tie_word_embeddings=False, **COMMON),
                           root / "qwen3_moe", tiny_model_dir),
    }
