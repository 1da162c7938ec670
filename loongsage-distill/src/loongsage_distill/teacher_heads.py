"""Teacher LM heads held in the train actor: full-vocabulary teacher logits, rebuilt per chunk.

Shipping a teacher's full-vocabulary distribution costs V floats per token (≈ 300 KB at a
150k vocabulary; marin-community/marin issue #7236); its final hidden state costs H (a few KB). So
for the
``full_*`` methods the teacher engine returns hidden states and the train actor rebuilds
the logits with the teacher's own output layer, one chunk of positions at a time inside the
student's chunked LM head (baidu-baige/LoongSage ``teacher_lm_head.py``, without its tensor-parallel
slicing). ``TeacherHeads`` loads each teacher's output layer once per process, reading only
that tensor from the checkpoint (the input embedding's when the model ties them), in fp32
with ``model.fp32_lm_head``.
"""

from __future__ import annotations

import json
from pathlib import Path
import torch

_LOADED: dict[tuple[str, bool, str], tuple[torch.Tensor, torch.Tensor | None]] = {}


def _output_parameter_names(path: str) -> tuple[str, str | None]:
    """The checkpoint keys of the model's output-layer weight (and bias), found on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    head = model.get_output_embeddings()
    names = {id(p): n for n, p in model.named_parameters()}  # tied weights keep the embedding's name
    bias = names[id(head.bias)] if getattr(head, "bias", None) is not None else None
    return names[id(head.weight)], bias


def _read_tensor(folder: Path, key: str) -> torch.Tensor:
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    filename = json.loads(index.read_text())["weight_map"][key] if index.exists() else "model.safetensors"
    with safe_open(str(folder / filename), framework="pt") as handle:
        return handle.get_tensor(key)


def load_head(path: str, fp32: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(weight [V, H], bias [V] or None)`` of the teacher at ``path`` (a resolved model folder),
    on ``device``, loaded once per process."""
    key = (path, fp32, str(device))
    if key not in _LOADED:
        weight_name, bias_name = _output_parameter_names(path)
        folder = Path(path)
        weight = _read_tensor(folder, weight_name)
        bias = _read_tensor(folder, bias_name) if bias_name else None
        if fp32:
            weight, bias = weight.float(), (None if bias is None else bias.float())
        _LOADED[key] = (weight.to(device), None if bias is None else bias.to(device))
    return _LOADED[key]


def teacher_logprobs(hidden: torch.Tensor, teacher: torch.Tensor, paths: tuple[str, ...], fp32: bool,
                     vocab: int) -> torch.Tensor:
    """``[c, V]`` log-softmax of each position's teacher logits, from its hidden state [c, H].

    ``teacher[c]`` is each position's index into ``paths`` (-1: no teacher, left at 0).
    """
    out = hidden.new_zeros(hidden.shape[0], vocab, dtype=torch.float32)
    for index in teacher.unique().tolist():
        if index < 0:
            continue
        rows = (teacher == index).nonzero().squeeze(-1)
        weight, bias = load_head(paths[index], fp32, hidden.device)
        h = hidden.index_select(0, rows)[:, : weight.shape[1]]  # hidden states are padded to the widest teacher
        logits = torch.nn.functional.linear(h.to(weight.dtype), weight, bias).float()
        out.index_copy_(0, rows, torch.log_softmax(logits, dim=-1))
    return out
