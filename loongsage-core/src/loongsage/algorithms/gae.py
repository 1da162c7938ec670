"""``gae``: Generalised Advantage Estimation from per-token values (Schulman et al. 2016,
arXiv 1506.02438), over the tokens the policy sampled.

With r_t the token rewards (the outcome on the last loss token, −β·KL_t per token when the
KL is a reward penalty) and V_t the value of the state before token t (a value model's, supplied by a step term):

    δ_t = r_t + γ·V_{t+1} − V_t          Â_t = Σ_l (γλ)^l · δ_{t+l}          R_t = Â_t + V_t

where t, t+1, ... run over the row's loss tokens only. A token outside the loss mask (the
prompt, a tool's or environment's observation inside an agentic trajectory, padding) is not
an action: the recursion is carried across it unchanged, so it counts as no step and
neither discounts nor adds (verl ``compute_gae_advantage_return`` with its response mask;
SAO, Hou et al. 2026, skips observation tokens the same way). After the last loss token
V = 0 (the episode ends). The returns R are the values' targets (``gae_returns``); the
advantages are whitened over every loss token of the batch by default (verl, OpenRLHF).
Deviation from SAO: λ is a fixed parameter, not length-adaptive.
"""

from __future__ import annotations

import torch

from loongsage.algorithms.advantages import masked_whiten
from loongsage.algorithms.params import GAEParams
from loongsage.algorithms.types import AdvantageInputs


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
        gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)`` [N, L], zero outside ``mask``, skipping unmasked tokens."""
    mask = mask.to(values.dtype)
    rewards, values = token_rewards.to(values.dtype) * mask, values * mask
    advantages = torch.zeros_like(values)
    next_value = values.new_zeros(values.shape[0])
    running = values.new_zeros(values.shape[0])
    for t in reversed(range(values.shape[-1])):
        here = mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        step = delta + gamma * lam * running
        running = torch.where(here, step, running)
        next_value = torch.where(here, values[:, t], next_value)
        advantages[:, t] = torch.where(here, step, torch.zeros_like(step))
    return advantages, (advantages + values) * mask


def _checked_values(inputs: AdvantageInputs) -> torch.Tensor:
    if inputs.values is None:
        raise ValueError("advantage estimator 'gae' needs per-token values [N, L] (a value model's)")
    if inputs.values.shape != inputs.mask.shape:
        raise ValueError(f"gae: values {tuple(inputs.values.shape)} must match the loss mask "
                         f"{tuple(inputs.mask.shape)}")
    return inputs.values.detach().to(inputs.mask.dtype)


def gae_advantage(inputs: AdvantageInputs, params: GAEParams) -> torch.Tensor:
    """GAE advantages from the per-token values, whitened over the batch when ``params.whiten``."""
    advantages, _ = gae(inputs.token_rewards, _checked_values(inputs), inputs.mask, params.gamma, params.lam)
    return masked_whiten(advantages, inputs.mask) if params.whiten else advantages


def gae_returns(inputs: AdvantageInputs, params: GAEParams) -> torch.Tensor:
    """The value targets R_t = Â_t + V_t (before any whitening of Â)."""
    return gae(inputs.token_rewards, _checked_values(inputs), inputs.mask, params.gamma, params.lam)[1]


gae_advantage.returns = gae_returns  # value targets of a values-based estimator (types.py)
