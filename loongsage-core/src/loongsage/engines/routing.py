"""Routed experts of a Mixture-of-Experts model: record them, compare them, replay them.

**Record format** (every engine and record uses it): per sample an integer array
``[tokens, layers, top_k]`` aligned with the sample's tokens (prompt, then response): row ``t``
holds, for each MoE layer in model order, the experts that layer chose for token ``t`` as an
input. ``-1`` marks a token without a record: the last token of a sequence (no forward has
consumed it yet), or a turn whose engine returned no routes. ``NO_ROUTE`` is that value and
``ROUTE_DTYPE`` the array type (int16: at most 32767 experts).

**Replay** (R3, arXiv 2510.11370; R2 from the GSPO paper): the recorded selection ``I`` is used
in place of the training router's own top-k, and the gate weights are recomputed from the
training router's logits ``s``: ``g_i = I_i·exp(s_i) / Σ_j I_j·exp(s_j)``, so the router keeps its
gradient. With ``norm_topk_prob`` on (``builtin:tiny_moe``, Qwen3-MoE checkpoints) that is what
the model computes for its own selection; without it the weights are the full softmax gathered
at the replayed experts, again as the model does for its own. Tokens without a record keep the
model's own routing.

Routers are found as the modules of an HF MoE block that return ``(router_logits,
top_k_weights, top_k_index)`` and carry ``top_k`` and ``num_experts`` (transformers'
``*TopKRouter``: Qwen2-MoE, Qwen3-MoE). Hooks stay installed for the model's lifetime and act
only while :meth:`MoeRouters.routing` is active, so a recomputed forward (activation
checkpointing during the backward) replays the same routes when the backward runs inside it.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch import nn

from loongsage.errors import ConfigError

NO_ROUTE = -1
ROUTE_DTYPE = torch.int16


def find_routers(model: nn.Module) -> list[nn.Module]:
    """The top-k router modules of ``model``, in layer order (empty for a dense model)."""
    return [m for m in model.modules()
            if type(m).__name__.endswith("TopKRouter") and hasattr(m, "top_k") and hasattr(m, "num_experts")]


@dataclass
class RoutingPass:
    """What one forward did with routes: the model's own choices and the mismatch count.

    ``captured[layer]`` is the top-k index ``[T, top_k]`` the layer used (the replayed one where a
    route was replayed, else its own) at the flat positions of the forward's input (row-major
    over ``[N, L]``). Of the ``compared`` positions with a record in ``compare``, ``mismatched``
    counts those whose used top-k set differs from it in at least one layer, ``own_mismatched``
    those whose own (unreplayed) top-k does: the mismatch replay removes.
    """

    replay: torch.Tensor | None = None  # [T, layers, k] long, NO_ROUTE where not replayed
    compare: torch.Tensor | None = None  # [T, layers, k] long
    capture: bool = False
    captured: dict[int, torch.Tensor] = field(default_factory=dict)
    differs: dict[str, torch.Tensor] = field(default_factory=dict)  # "used" / "own": [T] bool

    @property
    def mismatched(self) -> int:
        return int(self.differs["used"].sum()) if "used" in self.differs else 0

    @property
    def own_mismatched(self) -> int:
        return int(self.differs["own"].sum()) if "own" in self.differs else 0

    def _note(self, kind: str, differs: torch.Tensor) -> None:
        seen = self.differs.get(kind)
        self.differs[kind] = differs if seen is None else seen | differs

    @property
    def compared(self) -> int:
        return int((self.compare[:, 0] >= 0).all(-1).sum()) if self.compare is not None else 0

    def routes(self) -> torch.Tensor:
        """The captured routes ``[T, layers, k]`` in ``ROUTE_DTYPE``."""
        layers = [self.captured[i] for i in sorted(self.captured)]
        return torch.stack(layers, dim=1).to(ROUTE_DTYPE).cpu()


def _flat(routes: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    if routes is None:
        return None
    return routes.reshape(-1, *routes.shape[-2:]).to(device=device, dtype=torch.long)


def _same_set(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.sort(dim=-1).values == b.sort(dim=-1).values).all(dim=-1)


class MoeRouters:
    """Forward hooks on a model's routers that capture, compare or replay routes."""

    def __init__(self, model: nn.Module) -> None:
        self.routers = find_routers(model)
        self._layer = {id(m): i for i, m in enumerate(self.routers)}
        self._pass: RoutingPass | None = None
        for router in self.routers:
            router.register_forward_hook(self._hook)

    @property
    def is_moe(self) -> bool:
        return bool(self.routers)

    @property
    def shape(self) -> tuple[int, int]:
        """``(layers, top_k)`` of a route record."""
        return (len(self.routers), int(self.routers[0].top_k)) if self.routers else (0, 0)

    @contextmanager
    def routing(self, *, replay: torch.Tensor | None = None, compare: torch.Tensor | None = None,
                capture: bool = False) -> Iterator[RoutingPass]:
        """Within the block, forwards replay ``replay`` (``[N, L, layers, k]`` aligned with the
        input), count mismatches against ``compare`` and keep their own routes if ``capture``."""
        device = self.routers[0].weight.device if self.routers else torch.device("cpu")
        current = RoutingPass(_flat(replay, device), _flat(compare, device), capture)
        self._pass = current if self.routers else None
        try:
            yield current
        finally:
            self._pass = None

    def _hook(self, module: nn.Module, args: tuple, output: tuple) -> tuple | None:
        current = self._pass
        if current is None:
            return None
        logits, weights, own = output
        layer = self._layer[id(module)]
        index = own
        if current.replay is not None:
            want = current.replay[:, layer]
            index = torch.where((want >= 0).all(-1, keepdim=True), want, own)
        if current.capture:
            current.captured[layer] = index.detach()
        if current.compare is not None:
            want = current.compare[:, layer]
            recorded = (want >= 0).all(-1)
            current._note("own", recorded & ~_same_set(own, want))
            current._note("used", recorded & ~_same_set(index, want))
        if current.replay is None:
            return None
        gate = torch.softmax(logits, dim=-1, dtype=torch.float).gather(-1, index)
        if getattr(module, "norm_topk_prob", False):
            gate = gate / gate.sum(dim=-1, keepdim=True)
        return logits, gate.to(weights.dtype), index

# trainer.router_replay -> the TrainBatch extra whose routes the train forwards replay:
# R3 replays the rollout engine's, R2 those the pi_old forward of the step recorded.
REPLAY_SOURCES: dict[str, str | None] = {
    "off": None,
    "rollout": "routed_experts",
    "old_policy": "old_routed_experts",
}


def config_is_moe(model_path: str | Path) -> bool:
    """Whether the HF folder's ``config.json`` describes a top-k routed MoE (without loading it)."""
    config = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    text = config.get("text_config", config)
    return int(text.get("num_experts_per_tok") or 0) > 0


def check_router_replay(mode: str, routers: MoeRouters, model_path: str) -> None:
    """Refuse an unknown ``trainer.router_replay`` and replay on a model without MoE routers."""
    if mode not in REPLAY_SOURCES:
        raise ConfigError("trainer.router_replay", f"expected one of {sorted(REPLAY_SOURCES)}, got {mode!r}")
    if mode != "off" and not routers.is_moe:
        raise ConfigError("trainer.router_replay", f"{mode!r} replays MoE expert routing, but "
                          f"{model_path} is a dense model (no top-k router layers); use 'off'")
