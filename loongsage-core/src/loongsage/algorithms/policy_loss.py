"""PPO-clip policy loss with clip-higher and dual-clip (core built-in ``ppo_clip``).

Sources: PPO, arXiv 1707.06347; asymmetric ε_low/ε_high ("clip-higher") from DAPO,
arXiv 2503.14476; dual-clip from arXiv 1912.09729. With ρ = π_θ/π_old per token:

    ℓ = −min(ρÂ, clip(ρ, 1−ε_low, 1+ε_high)·Â)
    if Â < 0 and c is set:  ℓ = min(ℓ, −c·Â)      (= −max(min(...), c·Â))

Dual-clip bounds the loss of a negative-advantage token whose ratio exploded; tokens with
Â ≥ 0 are unchanged. Defaults: ε_low 0.2, ε_high 0.28 (DAPO, baidu-baige/LoongSage), c = 3 (verl's
``clip_ratio_c``; baidu-baige/LoongSage uses 10). log ρ is clamped to [−20, 20] before exp, as verl
does.

Metrics: ``train/pg_clipfrac`` (tokens where the clipped term is the active one),
``train/pg_clipfrac_lower`` (tokens where dual-clip is active), ``train/ppo_kl``
(mean of log π_old − log π_θ) and ``train/ratio_mean``.
"""

from __future__ import annotations

import torch

from loongsage.algorithms.params import PPOClipParams
from loongsage.algorithms.types import PolicyLossInputs, PolicyLossOutput

LOG_RATIO_CLAMP = 20.0


def ppo_clip_loss(inputs: PolicyLossInputs, params: PPOClipParams) -> PolicyLossOutput:
    """PPO-clip with asymmetric clip-higher bounds and optional dual-clip."""
    log_ratio = (inputs.logprobs - inputs.old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    adv = inputs.advantages
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - params.eps_low, 1.0 + params.eps_high)
    loss = torch.maximum(unclipped, clipped)
    clip_active = (clipped > unclipped).float()
    dual_active = torch.zeros_like(loss)
    if params.dual_clip is not None:
        cap = -params.dual_clip * adv
        capped = torch.minimum(loss, cap)
        dual_active = ((adv < 0) & (loss > cap)).float()
        loss = torch.where(adv < 0, capped, loss)
    return PolicyLossOutput(
        loss=loss,
        metrics={
            "train/pg_clipfrac": clip_active.detach(),
            "train/pg_clipfrac_lower": dual_active.detach(),
            "train/ppo_kl": -log_ratio.detach(),
            "train/ratio_mean": ratio.detach(),
        },
    )
