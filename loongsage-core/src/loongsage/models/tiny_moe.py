"""A deterministic tiny Qwen3-MoE (``builtin:tiny_moe``) for router-replay (R3) tests.

Same recipe as the tiny dense model (``models.tiny``): the locally trained tokenizer, weights
from ``torch.manual_seed(seed)`` and HF's own initialisation, a normal HF folder that
``AutoModelForCausalLM`` loads without LoongSage. The body is Qwen3-MoE (no shared expert):
hidden 128, 4 layers, every layer sparse with 4 experts and top-2 routing. ``norm_topk_prob``
is on, so the two selected experts' gate weights are the softmax over those two router logits,
exactly the gate R3 recomputes from the training logits (R3, arXiv 2510.11370). Router weights are
drawn 25x wider than HF's default (std 0.5, not 0.02): at HF's init every token's four router
logits are near ties, so any weight change would re-route almost every token, which a trained
MoE does not do. About 1.05 M parameters.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from loongsage.models.cache import build_once
from loongsage.models.tiny import default_cache_root, save_seeded_model, source_hash

TINY_MOE_ARCH = dict(
    hidden_size=128,
    intermediate_size=256,
    moe_intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    num_experts=4,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    max_position_embeddings=2048,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)


ROUTER_INIT_SCALE = 25.0


def _confident_routers(config: Qwen3MoeConfig) -> Qwen3MoeForCausalLM:
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.mul_(ROUTER_INIT_SCALE)
    return model


def build_tiny_moe_model(out_dir: str | Path, seed: int = 0) -> Path:
    """Write the tiny MoE model + tokenizer to ``out_dir`` (created; files overwritten)."""
    return save_seeded_model(out_dir, _confident_routers, Qwen3MoeConfig, TINY_MOE_ARCH, seed)


def ensure_tiny_moe_model(cache_dir: str | Path | None = None, seed: int = 0) -> Path:
    """Build the tiny MoE model once into a content-addressed cache folder and reuse it."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    final = root / f"tiny-qwen3moe-{source_hash(seed, 'tiny_moe.py')}"
    if (final / "config.json").exists():
        return final
    return build_once(final, lambda tmp: build_tiny_moe_model(tmp, seed=seed))
