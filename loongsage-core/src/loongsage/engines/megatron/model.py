"""Building this rank's Megatron ``GPTModel`` stage from a HF folder, and its weights back.

``build_stage`` makes the stage (local layer spec, the rank's pipeline layers and TP
shards) and fills it from the HF safetensors through ``convert``; ``stage_megatron_state``
is the stage's state dict with global layer numbers and TP pieces merged (a collective over
the TP group); ``full_hf_state`` gathers every stage's and converts back to HF names, on
every rank (the export TransferMesh and checkpoints need).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from loongsage.engines.megatron import cpu_shims
from loongsage.engines.megatron.arch import megatron_settings
from loongsage.engines.megatron.convert import (
    global_name,
    hf_to_megatron,
    megatron_to_hf,
    stage_layers,
    stage_state,
    tp_merge,
    tp_shard,
)
from loongsage.engines.megatron.parallel import MegatronRanks
from loongsage.errors import LoongSageError


def build_stage(hf_config: Any, hf_weights: dict[str, torch.Tensor], dtype: str,
                ranks: MegatronRanks) -> torch.nn.Module:
    """This rank's ``GPTModel`` (its stage, its TP shards) holding ``hf_weights``."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    layout = ranks.layout
    config_kwargs, model_kwargs = megatron_settings(hf_config, dtype, layout.tp, layout.pp)
    config = TransformerConfig(**config_kwargs)
    spec = get_gpt_layer_local_spec(num_experts=config.num_moe_experts, normalization="RMSNorm",
                                    qk_layernorm=config.qk_layernorm)
    with cpu_shims.cuda_factories_on_cpu():
        model = GPTModel(config, spec, pre_process=ranks.first_stage, post_process=ranks.last_stage,
                         **model_kwargs)
    layers = stage_layers(hf_config.num_hidden_layers, ranks.pp_rank, layout.pp)
    full = hf_to_megatron(hf_weights, hf_config)
    local = stage_state(full, layers, ranks.first_stage, ranks.last_stage,
                        bool(hf_config.tie_word_embeddings))
    own = {name: tensor for name, tensor in model.state_dict().items() if torch.is_tensor(tensor)}
    missing, extra = sorted(set(own) - set(local)), sorted(set(local) - set(own))
    if missing or extra:
        raise LoongSageError(f"HF -> Megatron conversion of {hf_config.model_type}: Megatron "
                             f"names not filled {missing[:5]}, converted names without a "
                             f"Megatron parameter {extra[:5]}")
    with torch.no_grad():
        for name, tensor in own.items():
            piece = tp_shard(global_name(name, layers), local[name], ranks.tp_rank, layout.tp)
            if piece.shape != tensor.shape:
                raise LoongSageError(f"{name}: converted shape {tuple(piece.shape)}, Megatron "
                                     f"expects {tuple(tensor.shape)}")
            tensor.copy_(piece)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model.eval()


def stage_megatron_state(model: torch.nn.Module, hf_config: Any,
                         ranks: MegatronRanks) -> dict[str, torch.Tensor]:
    """This stage's unsharded tensors by global Megatron name (all TP ranks take part)."""
    import torch.distributed as dist

    layers = stage_layers(hf_config.num_hidden_layers, ranks.pp_rank, ranks.layout.pp)
    out = {}
    for name, tensor in model.state_dict().items():
        if not torch.is_tensor(tensor):
            continue
        tensor = tensor.detach()
        global_ = global_name(name, layers)
        if ranks.layout.tp > 1:
            pieces = [torch.empty_like(tensor) for _ in range(ranks.layout.tp)]
            dist.all_gather(pieces, tensor.contiguous(), group=ranks.tp_group)
            tensor = tp_merge(global_, pieces)
        out[global_] = tensor
    return out


def full_hf_state(model: torch.nn.Module, hf_config: Any, ranks: MegatronRanks) -> dict[str, torch.Tensor]:
    """The whole model in HF names and layouts, on every rank (a collective)."""
    import torch.distributed as dist

    stage = stage_megatron_state(model, hf_config, ranks)
    if ranks.layout.pp > 1:
        stages: list[Any] = [None] * ranks.layout.pp
        dist.all_gather_object(stages, stage, group=ranks.pp_group)
        stage = {}
        for part in stages:  # a later stage's tied output copy never overrides the embedding
            stage.update({k: v for k, v in part.items() if k not in stage})
    return megatron_to_hf(stage, hf_config)


def read_hf(folder: str | Path) -> tuple[Any, dict[str, torch.Tensor]]:
    """``(config, weights)`` of a HF folder, without building the HF model."""
    from transformers import AutoConfig

    from loongsage.engines.train_state import read_weights

    return AutoConfig.from_pretrained(str(folder)), read_weights(Path(folder))
