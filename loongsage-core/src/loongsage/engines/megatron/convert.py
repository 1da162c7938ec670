"""Hugging Face <-> Megatron-Core weights for the Llama family (and Qwen3-MoE experts).

``hf_to_megatron`` and ``megatron_to_hf`` convert whole, unsharded state dicts (Megatron
names with global layer numbers); ``tp_shard`` / ``tp_merge`` cut one Megatron tensor into a
tensor-parallel rank's piece and glue the pieces back; ``stage_state`` keeps one pipeline
stage's entries and renumbers its layers from 0, as that stage's ``GPTModel`` names them.
Every step is a reshape, slice or concatenation, never arithmetic, so HF -> Megatron -> HF
is bitwise equal.

Layouts (what megatron-bridge does for the same models; written here because the bridge
cannot be installed without CUDA, docs/backends.md):

* **QKV** is one column-parallel ``linear_qkv`` whose rows are grouped by key/value head
  (GQA group): for each of the ``num_query_groups`` groups, that group's query heads, then
  its key head, then its value head. A TP split along rows therefore hands each rank whole
  groups. Qwen2's QKV bias follows the same layout.
* **Gated MLP**: ``linear_fc1`` = ``[gate; up]``; a TP rank holds ``[gate_r; up_r]``
  (each half split separately), not a contiguous row slice.
* Column-parallel (split rows): embedding, QKV, fc1, output layer; row-parallel (split
  columns): ``linear_proj``, ``linear_fc2``; norms and the MoE router are replicated.
* Tied embeddings: HF has no ``lm_head.weight``; Megatron's last stage gets a copy of the
  embedding as ``output_layer.weight`` when it is not also the first stage.
* Qwen3-MoE: transformers 5 holds experts fused in memory (``mlp.experts.gate_up_proj[e]``
  = ``[gate; up]`` = ``local_experts.e.linear_fc1``; ``down_proj[e]`` = ``linear_fc2``) but
  writes them per expert to safetensors (``mlp.experts.<e>.{gate,up,down}_proj``); both are
  read, the fused in-memory form is written (what the embedded engine sends);
  ``mlp.gate`` = ``mlp.router``.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import torch

from loongsage.engines.megatron.arch import arch_of, head_dim

Tensors = dict[str, torch.Tensor]
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")

# Megatron layer-local name -> HF layer-local name, for tensors copied as they are
_DIRECT = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "mlp.router.weight": "mlp.gate.weight",
}
_COLUMN = ("embedding.word_embeddings.weight", "output_layer.weight", "linear_qkv.weight",
           "linear_qkv.bias")
_ROW = ("linear_proj.weight", "linear_fc2.weight")


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int) -> torch.Tensor:
    rest = q.shape[1:]
    return torch.cat([q.reshape(groups, -1, *rest), k.reshape(groups, -1, *rest),
                      v.reshape(groups, -1, *rest)], dim=1).reshape(-1, *rest)


def _split_qkv(qkv: torch.Tensor, hf_config: Any) -> tuple[torch.Tensor, ...]:
    groups, dim = hf_config.num_key_value_heads, head_dim(hf_config)
    per_group = hf_config.num_attention_heads // groups * dim
    grouped = qkv.reshape(groups, per_group + 2 * dim, *qkv.shape[1:])
    q, k, v = grouped.split([per_group, dim, dim], dim=1)
    return tuple(t.reshape(-1, *qkv.shape[1:]).contiguous() for t in (q, k, v))


def _expert(hf: Mapping[str, torch.Tensor], layer: str, e: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ``e``'s ``([gate; up], down)``: from the fused in-memory tensors, or from the
    per-expert names transformers 5 still writes to (and reads from) safetensors files."""
    fused = layer + "mlp.experts.gate_up_proj"
    if fused in hf:
        return hf[fused][e], hf[layer + "mlp.experts.down_proj"][e]
    one = f"{layer}mlp.experts.{e}."
    return (torch.cat([hf[one + "gate_proj.weight"], hf[one + "up_proj.weight"]]),
            hf[one + "down_proj.weight"])


def hf_to_megatron(hf: Mapping[str, torch.Tensor], hf_config: Any) -> Tensors:
    """A HF causal LM's state dict as an unsharded Megatron ``GPTModel`` state dict."""
    arch = arch_of(hf_config)
    out: Tensors = {"embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
                    "decoder.final_layernorm.weight": hf["model.norm.weight"]}
    if not hf_config.tie_word_embeddings:
        out["output_layer.weight"] = hf["lm_head.weight"]
    groups = hf_config.num_key_value_heads
    for i in range(hf_config.num_hidden_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        for mc_name, hf_name in _DIRECT.items():
            if src + hf_name in hf:
                out[dst + mc_name] = hf[src + hf_name]
        attn = src + "self_attn."
        out[dst + "self_attention.linear_qkv.weight"] = _fuse_qkv(
            hf[attn + "q_proj.weight"], hf[attn + "k_proj.weight"], hf[attn + "v_proj.weight"], groups)
        if arch.qkv_bias:
            out[dst + "self_attention.linear_qkv.bias"] = _fuse_qkv(
                hf[attn + "q_proj.bias"], hf[attn + "k_proj.bias"], hf[attn + "v_proj.bias"], groups)
        if arch.moe:
            for e in range(hf_config.num_experts):
                expert = f"{dst}mlp.experts.local_experts.{e}."
                out[expert + "linear_fc1.weight"], out[expert + "linear_fc2.weight"] = _expert(hf, src, e)
        else:
            out[dst + "mlp.linear_fc1.weight"] = torch.cat(
                [hf[src + "mlp.gate_proj.weight"], hf[src + "mlp.up_proj.weight"]])
    return out


def megatron_to_hf(mc: Mapping[str, torch.Tensor], hf_config: Any) -> Tensors:
    """An unsharded Megatron state dict back in HF names and layouts (tied copies left out)."""
    arch = arch_of(hf_config)
    out: Tensors = {"model.embed_tokens.weight": mc["embedding.word_embeddings.weight"],
                    "model.norm.weight": mc["decoder.final_layernorm.weight"]}
    if not hf_config.tie_word_embeddings:
        out["lm_head.weight"] = mc["output_layer.weight"]
    for i in range(hf_config.num_hidden_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        for mc_name, hf_name in _DIRECT.items():
            if src + mc_name in mc:
                out[dst + hf_name] = mc[src + mc_name]
        q, k, v = _split_qkv(mc[src + "self_attention.linear_qkv.weight"], hf_config)
        out.update({dst + "self_attn.q_proj.weight": q, dst + "self_attn.k_proj.weight": k,
                    dst + "self_attn.v_proj.weight": v})
        if arch.qkv_bias:
            q, k, v = _split_qkv(mc[src + "self_attention.linear_qkv.bias"], hf_config)
            out.update({dst + "self_attn.q_proj.bias": q, dst + "self_attn.k_proj.bias": k,
                        dst + "self_attn.v_proj.bias": v})
        if arch.moe:
            experts = range(hf_config.num_experts)
            out[dst + "mlp.experts.gate_up_proj"] = torch.stack(
                [mc[f"{src}mlp.experts.local_experts.{e}.linear_fc1.weight"] for e in experts])
            out[dst + "mlp.experts.down_proj"] = torch.stack(
                [mc[f"{src}mlp.experts.local_experts.{e}.linear_fc2.weight"] for e in experts])
        else:
            gate, up = mc[src + "mlp.linear_fc1.weight"].chunk(2)
            out[dst + "mlp.gate_proj.weight"] = gate.contiguous()
            out[dst + "mlp.up_proj.weight"] = up.contiguous()
    return out


def _tp_dim(name: str) -> int | None:
    if name.endswith(_COLUMN) or name.endswith("linear_fc1.weight"):
        return 0
    if name.endswith(_ROW):
        return 1
    return None


def tp_sharded(name: str) -> bool:
    """Whether each tensor-parallel rank holds a different piece of Megatron tensor ``name``."""
    return _tp_dim(name) is not None


def tp_shard(name: str, tensor: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Tensor-parallel rank ``rank``'s piece of the unsharded Megatron tensor ``name``."""
    dim = _tp_dim(name)
    if dim is None or size == 1:
        return tensor
    if name.endswith("linear_fc1.weight"):  # [gate; up] -> [gate_r; up_r]
        return torch.cat([half.chunk(size)[rank] for half in tensor.chunk(2)]).contiguous()
    return tensor.chunk(size, dim=dim)[rank].contiguous()


def tp_merge(name: str, pieces: list[torch.Tensor]) -> torch.Tensor:
    """The unsharded tensor from every tensor-parallel rank's piece (inverse of ``tp_shard``)."""
    dim = _tp_dim(name)
    if dim is None or len(pieces) == 1:
        return pieces[0]
    if name.endswith("linear_fc1.weight"):
        halves = [piece.chunk(2) for piece in pieces]
        return torch.cat([torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])])
    return torch.cat(pieces, dim=dim)


def stage_layers(num_layers: int, pp_rank: int, pp: int) -> range:
    """Global layer numbers held by pipeline stage ``pp_rank`` (even split)."""
    per = num_layers // pp
    return range(pp_rank * per, (pp_rank + 1) * per)


def stage_state(full: Mapping[str, torch.Tensor], layers: range, first: bool, last: bool,
                tied: bool) -> Tensors:
    """The entries of one pipeline stage, its layers renumbered from 0."""
    out: Tensors = {}
    for name, tensor in full.items():
        match = _LAYER.match(name)
        if match:
            i = int(match.group(1))
            if i in layers:
                out[f"decoder.layers.{i - layers.start}.{match.group(2)}"] = tensor
        elif name.startswith("embedding.") and first:
            out[name] = tensor
        elif name.startswith(("decoder.final_layernorm", "output_layer")) and last:
            out[name] = tensor
    if tied and last and not first:  # the last stage's own copy of the tied embedding
        out["output_layer.weight"] = full["embedding.word_embeddings.weight"]
    return out


def global_name(name: str, layers: range) -> str:
    """A stage-local Megatron name with its global layer number."""
    match = _LAYER.match(name)
    return f"decoder.layers.{int(match.group(1)) + layers.start}.{match.group(2)}" if match else name
