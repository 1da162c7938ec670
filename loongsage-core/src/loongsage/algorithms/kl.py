"""KL estimators between the trained policy and a frozen reference.

Source: J. Schulman, "Approximating KL Divergence" (2020); names as in verl
``core_algos.kl_penalty``. With δ = log π_θ − log π_ref on tokens sampled from π_θ and
r = π_ref/π_θ = e^{−δ}:

    k1          δ                       unbiased value; zero expected gradient as a loss,
                                        so use it detached, as a reward penalty
    k2          ½ δ²                    biased value; E[∇k2] = ∇KL(π_θ‖π_ref) exactly
    k3          r − 1 − log r           unbiased, ≥ 0; E[∇k3] = ∇KL(π_ref‖π_θ)
    low_var_kl  k3 with δ clamped to [−20, 20] and the result to [−10, 10] (verl's guard)
    k1_st       value of k1, gradient of k2 (straight-through; verl ``k1+``)
    k3_st       value of k3, gradient of k2 (straight-through; verl ``k3+``)

Every estimator maps per-token log-probs [N, L] to per-token values [N, L] and keeps the
gradient with respect to ``logprobs``; the objective masks and aggregates them.
Deviation from verl: the straight-through variants are named ``*_st`` rather than ``*+``
so they can be written unquoted in a Hydra override.
"""

from __future__ import annotations

import torch


def k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = log π_θ − log π_ref: unbiased value, use detached (reward penalty)."""
    return logprobs - ref_logprobs


def k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = ½(log π_θ − log π_ref)²: its gradient is the exact KL(π_θ‖π_ref) gradient."""
    return 0.5 * (logprobs - ref_logprobs).square()


def k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 = π_ref/π_θ − 1 − log(π_ref/π_θ): unbiased, non-negative, low variance."""
    log_r = ref_logprobs - logprobs
    return torch.expm1(log_r) - log_r


def low_var_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 with verl's clamps (log-ratio to ±20, value to ±10) against outliers."""
    log_r = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return (torch.expm1(log_r) - log_r).clamp(-10.0, 10.0)


def _straight_through(value: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor):
    grad_carrier = k2(logprobs, ref_logprobs)
    return grad_carrier + (value - grad_carrier).detach()


def k1_st(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Straight-through: value of k1, gradient of k2."""
    return _straight_through(k1(logprobs, ref_logprobs), logprobs, ref_logprobs)


def k3_st(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Straight-through: value of k3, gradient of k2."""
    return _straight_through(k3(logprobs, ref_logprobs), logprobs, ref_logprobs)
