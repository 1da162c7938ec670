"""megatron-bridge's ``AutoBridge`` for architectures our own conversion does not cover.

UNTESTED: megatron-bridge cannot be installed on a CPU-only Python 3.11 machine (it needs
Transformer Engine; docs/backends.md), so nothing here has ever run in this repository.
It is used only when the package imports and the checkpoint's ``model_type`` is not one of
``arch.ARCHS``; for those, ``convert`` is used (and tested) whether or not the bridge exists.
The calls follow megatron-bridge's documented API: ``AutoBridge.from_hf_pretrained``,
``to_megatron_provider(load_weights=True)`` with the parallel sizes set before
``finalize()``, ``provide_distributed_model(wrap_with_ddp=False)``, and
``export_hf_weights(models, cpu=True)`` for HF-named weights.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from loongsage.engines.megatron.arch import ARCHS


def uses_bridge(hf_config: Any) -> bool:
    """True when ``hf_config`` needs the bridge and megatron-bridge is installed."""
    return hf_config.model_type not in ARCHS and importlib.util.find_spec("megatron.bridge") is not None


def _bridge(path: str) -> Any:
    from megatron.bridge import AutoBridge

    return AutoBridge.from_hf_pretrained(path)


def build_with_bridge(path: str, tp: int, pp: int) -> torch.nn.Module:
    """This rank's stage of the checkpoint at ``path``, weights loaded by the bridge."""
    provider = _bridge(path).to_megatron_provider(load_weights=True)
    provider.tensor_model_parallel_size = tp
    provider.pipeline_model_parallel_size = pp
    provider.finalize()
    return provider.provide_distributed_model(wrap_with_ddp=False)[0]


def export_with_bridge(path: str, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model in HF names, gathered by the bridge (a collective over all ranks)."""
    return dict(_bridge(path).export_hf_weights([model], cpu=True))
