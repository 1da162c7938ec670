"""Which Hugging Face architectures map onto Megatron-Core's ``GPTModel``, and how.

One ``Arch`` per HF ``model_type`` (``ARCHS``) says what the Llama-family layer carries
beyond the common core (QKV bias, per-head q/k RMSNorm, a routed MoE MLP);
``megatron_settings`` turns a HF config into the ``TransformerConfig`` and ``GPTModel``
arguments that reproduce it with Megatron's local (non-Transformer-Engine) layer spec.

Refused (a ``ConfigError`` naming the HF config field): RoPE scaling other than none
(Megatron's Llama-3.1 scaling hard-codes factors a checkpoint may not use), sliding-window
attention, MoE checkpoints whose layers are not all sparse (``mlp_only_layers``,
``decoder_sparse_step``) and vocabularies that do not split evenly over TP ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from loongsage.errors import ConfigError


@dataclass(frozen=True)
class Arch:
    """What a HF decoder layer of this ``model_type`` has beyond Llama's."""

    qkv_bias: bool = False  # Qwen2 always; Llama when ``attention_bias``
    qk_norm: bool = False  # Qwen3: RMSNorm over each head's queries and keys
    moe: bool = False  # routed experts with softmax top-k (Qwen3-MoE layout)


ARCHS: dict[str, Arch] = {
    "llama": Arch(),
    "mistral": Arch(),
    "qwen2": Arch(qkv_bias=True),
    "qwen3": Arch(qk_norm=True),
    "qwen3_moe": Arch(qk_norm=True, moe=True),
}

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def arch_of(hf_config: Any) -> Arch:
    """The ``Arch`` of a HF config, or a ``ConfigError`` listing the supported types."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in ARCHS:
        raise ConfigError("model.path", f"train.backend=megatron converts {sorted(ARCHS)} "
                          f"checkpoints itself, got model_type {model_type!r}; install "
                          "megatron-bridge for other architectures")
    arch = ARCHS[model_type]
    if model_type == "llama" and getattr(hf_config, "attention_bias", False):
        arch = Arch(qkv_bias=True)
    return arch


def head_dim(hf_config: Any) -> int:
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


def _rope_theta(hf_config: Any) -> float:
    rope = getattr(hf_config, "rope_parameters", None) or {}
    kind = rope.get("rope_type", "default")
    if kind != "default":
        raise ConfigError("model.path", f"rope_parameters.rope_type {kind!r}: the megatron backend "
                          "converts unscaled RoPE only (rope_type 'default')")
    return float(rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))


def _moe_settings(hf_config: Any, pp: int) -> dict[str, Any]:
    if pp > 1 and not torch.cuda.is_available():
        raise ConfigError("train.megatron.pp", "MoE models train at pp=1 on CPU: Megatron's "
                          "pipeline schedule with variable shapes needs the alltoall token "
                          "dispatcher, which uses CUDA streams")
    if getattr(hf_config, "mlp_only_layers", []) or getattr(hf_config, "decoder_sparse_step", 1) != 1:
        raise ConfigError("model.path", "mlp_only_layers / decoder_sparse_step: the megatron "
                          "backend converts MoE models whose every layer is sparse")
    return dict(
        num_moe_experts=hf_config.num_experts,
        moe_router_topk=hf_config.num_experts_per_tok,
        moe_ffn_hidden_size=hf_config.moe_intermediate_size,
        # HF: softmax over all experts, top-k, renormalised when norm_topk_prob; Megatron's
        # default (pre_softmax False) is top-k then softmax over the k, i.e. renormalised
        moe_router_pre_softmax=not hf_config.norm_topk_prob,
        moe_router_score_function="softmax",
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0,
        moe_grouped_gemm=False,
    )


def megatron_settings(hf_config: Any, dtype: str, tp: int, pp: int) -> tuple[dict, dict]:
    """``(TransformerConfig kwargs, GPTModel kwargs)`` reproducing ``hf_config``."""
    arch = arch_of(hf_config)
    if getattr(hf_config, "use_sliding_window", False):
        raise ConfigError("model.path", "use_sliding_window: not converted to Megatron")
    if dtype not in _DTYPES:
        raise ConfigError("model.dtype", f"expected one of {sorted(_DTYPES)}, got {dtype!r}")
    for field, value in (("vocab_size", hf_config.vocab_size),
                         ("num_key_value_heads", hf_config.num_key_value_heads)):
        if value % tp:
            raise ConfigError("train.megatron.tp", f"{field} {value} does not split over {tp} ranks")
    if hf_config.num_hidden_layers % pp:
        raise ConfigError("train.megatron.pp", f"num_hidden_layers {hf_config.num_hidden_layers} "
                          f"does not split into {pp} stages")
    params_dtype = _DTYPES[dtype]
    config = dict(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=hf_config.num_key_value_heads,
        kv_channels=head_dim(hf_config),
        ffn_hidden_size=hf_config.intermediate_size,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        use_cpu_initialization=True,
        perform_initialization=False,  # every weight is overwritten by the conversion
        masked_softmax_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        calculate_per_token_loss=True,  # our closures divide by global token counts
        # pipeline stages exchange each micro-batch's own shape; 0.16.1 allows that only with
        # the alltoall MoE dispatcher, which needs CUDA streams (so MoE runs at pp=1 on CPU)
        variable_seq_lengths=pp > 1,
        moe_token_dispatcher_type="alltoall" if pp > 1 else "allgather",
        **(_moe_settings(hf_config, pp) if arch.moe else {}),
    )
    model = dict(
        vocab_size=hf_config.vocab_size,
        max_sequence_length=hf_config.max_position_embeddings,
        share_embeddings_and_output_weights=bool(hf_config.tie_word_embeddings),
        position_embedding_type="rope",
        rotary_base=_rope_theta(hf_config),
        parallel_output=True,
    )
    return config, model
