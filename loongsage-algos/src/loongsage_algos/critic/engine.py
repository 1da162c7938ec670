"""``embedded_critic``: a value model (a HF causal LM's decoder with a scalar head), trained by
the clipped value loss in its own actor, with its own optimizer (the step term ``critic``'s
default ``algorithm.critic.backend``).

The value of position t is V(s_t), the value of the state *before* token t: the head reads
the decoder's hidden state at t − 1, the same position whose LM head gives log p(token t), so
values line up with log-probs and loss masks (``loongsage.engines.batch``). The model starts
from the policy's checkpoint or ``algorithm.critic.path``; the head is a ``Linear(hidden, 1)``
in fp32 registered on the model as ``value_head``, its weight drawn from N(0, σ²) with the
model's ``initializer_range`` σ and its bias 0 (verl's token-classification head), unless the
folder is a saved critic, whose head is loaded with it. A zero head would be a trap: the body's
gradients are then ~0 but AdamW scales every step to the learning rate, and the tiny critic
collapsed to one constant value for every token (measured: value std 1.5e-4 over tokens after
20 steps, explained variance 0). After a supervised warm start the critic's step extension
copies the warm-started policy into it (``load_body``) unless ``algorithm.critic.path`` is set,
so the critic starts from the policy RL starts from (verl initialises both from one
checkpoint). Loss, for returns R and the values V_old the step started with
(verl ``compute_value_loss``, OpenRLHF ``ValueLoss``):

    L_V = ½ · max((V − R)², (V_old + clip(V − V_old, −ε_v, ε_v) − R)²)

averaged over the loss tokens of each mini-batch (token mean, global denominators as the
policy's loss). Micro-batching, AdamW, gradient clipping, non-finite refusal, checkpoints and
host offload are the embedded train engine's (this class extends it); the critic is one
process (no data parallelism). ``freeze_attention`` trains everything but the attention
layers (SAO's critic).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import safe_open
from torch import nn

from loongsage.plugin import (
    EmbeddedTrainEngine, ModelConfig, TrainBatch, TrainConfig, check_loaded, checkpoint_files, config_section,
    final_hidden, read_weights, resolve_model_path, scatter_positions, scatter_rows, train_section,
)

from loongsage_algos.critic.config import CriticConfig

HEAD = "value_head"


def saved_head(folder: Path) -> dict[str, torch.Tensor] | None:
    """The ``value_head.*`` tensors of a saved critic folder, or None for any other model."""
    found: dict[str, torch.Tensor] = {}
    for path in checkpoint_files(folder):
        with safe_open(str(path), "pt") as f:
            for key in f.keys():
                if key.startswith(f"{HEAD}."):
                    found[key[len(HEAD) + 1:]] = f.get_tensor(key)
    return found or None


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ½·max((V−R)², (clip(V, V_old±ε)−R)²) and where the clipped term is larger."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    plain, bounded = (values - returns) ** 2, (clipped - returns) ** 2
    return 0.5 * torch.maximum(plain, bounded), (bounded > plain).float()


class EmbeddedCriticEngine(EmbeddedTrainEngine):
    """A value model trained on returns; see the module docstring."""

    def __init__(self, model: ModelConfig, train: TrainConfig, critic: CriticConfig, *,
                 device: str | None = None, seed: int = 0) -> None:
        super().__init__(model, dataclasses.replace(train, lr=critic.lr), device=device, seed=seed)
        self.critic_cfg = critic
        head = nn.Linear(self.model.config.hidden_size, 1, dtype=torch.float32)
        state = saved_head(Path(model.path))
        if state is None:
            nn.init.normal_(head.weight, std=getattr(self.model.config, "initializer_range", 0.02))
            nn.init.zeros_(head.bias)
        else:
            head.load_state_dict(state)
        self.model.add_module(HEAD, head.to(self.device))
        if critic.freeze_attention:
            for name, param in self.model.named_parameters():
                if ".self_attn." in name:
                    param.requires_grad_(False)
        self.optimizer = self._new_optimizer(critic.lr)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], device: str | None = None) -> "EmbeddedCriticEngine":
        """Build from the full resolved config (``model``, ``train``, ``algorithm.critic``)."""
        model = config_section(cfg, "model", ModelConfig)
        critic = config_section(cfg.get("algorithm") or {}, "critic", CriticConfig)
        model.path = str(resolve_model_path(str(critic.path or model.path)))
        train = train_section(cfg)
        trainer = cfg.get("trainer") or {}
        return cls(model, train, critic, device=device, seed=int(trainer.get("seed", 0)))

    def _values(self, batch: TrainBatch) -> torch.Tensor:
        ids, attention = batch.input_ids.to(self.device), batch.attention_mask.to(self.device)
        hidden, real = final_hidden(self.model, ids, attention)
        values = self.model.get_submodule(HEAD)(hidden.float())
        return scatter_positions(values, real, ids.shape)[..., 0]

    @torch.no_grad()
    def load_body(self, path: str | Path) -> None:
        """Replace the decoder's weights by a policy's HF folder (the warm-started policy), keeping
        the value head; AdamW moments restart."""
        folder = Path(path)
        missing, unexpected = self.model.load_state_dict(read_weights(folder), strict=False)
        check_loaded(folder, self.model, [k for k in missing if not k.startswith(f"{HEAD}.")], unexpected)
        self.optimizer = self._new_optimizer(self.critic_cfg.lr)

    @torch.no_grad()
    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        """V(s_t) [N, L] in fp32 on CPU (0 at position 0 and padding), without grad."""
        parts = [(rows, self._values(micro).cpu()) for rows, micro in self._micro_batches(batch)]
        return scatter_rows(parts, *batch.input_ids.shape)

    def train_values(self, batch: TrainBatch, returns: torch.Tensor, old_values: torch.Tensor,
                     mini_batches: int = 1) -> dict[str, float]:
        """One pass over ``batch`` in ``mini_batches`` optimizer steps on the clipped value loss;
        returns the mini-batch mean of ``critic/value_loss``, ``critic/value_clipfrac``,
        ``critic/grad_norm``."""
        batch = TrainBatch(batch.input_ids, batch.attention_mask, batch.loss_mask,
                           {"returns": returns, "old_values": old_values})
        mini_batches = max(1, min(mini_batches, len(batch)))
        totals: dict[str, float] = {}
        for rows in torch.tensor_split(torch.arange(len(batch)), mini_batches):
            for key, value in self._value_step(batch.rows(rows)).items():
                totals[key] = totals.get(key, 0.0) + value / mini_batches
        return totals

    def _value_step(self, batch: TrainBatch) -> dict[str, float]:
        tokens = max(float(batch.loss_mask.sum()), 1.0)
        self.optimizer.zero_grad(set_to_none=True)
        loss_total, clipped_total = 0.0, 0.0
        for _, micro in self._micro_batches(batch):
            mask = micro.loss_mask.to(self.device).float()
            per_token, clipped = clipped_value_loss(
                self._values(micro), micro.extras["old_values"].to(self.device),
                micro.extras["returns"].to(self.device), self.critic_cfg.value_clip)
            loss = (per_token * mask).sum() / tokens
            if not math.isfinite(float(loss.detach())):
                self._refuse_non_finite("value loss", {"critic/value_loss": float(loss.detach())})
            loss.backward()
            loss_total += float(loss.detach())
            clipped_total += float((clipped * mask).sum()) / tokens
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        if not math.isfinite(float(norm)):
            self._refuse_non_finite("value gradient", {"critic/grad_norm": float(norm)})
        if self.train_cfg.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, self.train_cfg.grad_clip, norm)
        self.optimizer.step()
        self.weight_version += 1
        self.optimizer.zero_grad(set_to_none=True)
        return {"critic/value_loss": loss_total, "critic/value_clipfrac": clipped_total,
                "critic/grad_norm": float(norm)}
