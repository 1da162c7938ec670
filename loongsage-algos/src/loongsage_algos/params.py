"""Typed parameters of every loongsage-algos plugin (torch-free, imported by ``plugin.py``).

``uses_rollout_ratio`` (class variable) marks components that use log(π_old/π_roll); the
algorithm validator rejects two of them in one objective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

# ---- advantages --------------------------------------------------------------------------


@dataclass
class DrGRPOParams:
    """Dr. GRPO: r − group mean, no std division (pair with seq_mean_token_sum_norm)."""

    group_baseline: ClassVar[bool] = True


@dataclass
class RLOOParams:
    """RLOO: r minus the mean of the other G−1 samples of the group."""

    group_baseline: ClassVar[bool] = True


@dataclass
class ReinforcePPParams:
    """REINFORCE++: discounted token returns of the KL-shaped reward, whitened over the batch."""

    gamma: float = 1.0  # discount per response token of the returns, in (0, 1]

    def __post_init__(self) -> None:
        if not 0 < self.gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")


@dataclass
class ReinforcePPBaselineParams:
    """REINFORCE++-baseline: r − group mean, then whitened over every token of the batch."""

    group_baseline: ClassVar[bool] = True


# ---- policy losses -----------------------------------------------------------------------


def _check_eps(eps_low: float, eps_high: float) -> None:
    if not 0 <= eps_low <= 1:
        raise ValueError(f"eps_low must be in [0, 1], got {eps_low}")
    if eps_high < 0:
        raise ValueError(f"eps_high must be >= 0, got {eps_high}")


@dataclass
class GSPOParams:
    """GSPO: sequence-level ratio (geometric mean of token ratios), clipped per sequence."""

    eps_low: float = 3e-4  # sequence ratio clipped below at 1 - eps_low
    eps_high: float = 4e-4  # sequence ratio clipped above at 1 + eps_high
    uses_rollout_ratio: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _check_eps(self.eps_low, self.eps_high)


@dataclass
class GSPOTokenParams(GSPOParams):
    """GSPO-token: sequence-ratio value with per-token gradients and advantages."""


@dataclass
class CISPOParams:
    """CISPO: clipped, detached IS weight times Â·log π_θ; clipped tokens keep their gradient."""

    eps_low: float = 1.0  # 1.0 = no lower bound (MiniMax-M1 tunes only eps_high)
    eps_high: float = 0.28  # the IS weight is clipped at 1 + eps_high
    uses_rollout_ratio: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _check_eps(self.eps_low, self.eps_high)


@dataclass
class SAOParams:
    """SAO: ratio π_θ/π_roll, tokens outside [1 − eps_low, 1 + eps_high] masked out entirely."""

    eps_low: float = 0.2  # tokens with ratio below 1 - eps_low leave the loss
    eps_high: float = 0.28  # tokens with ratio above 1 + eps_high leave the loss
    uses_rollout_ratio: ClassVar[bool] = True  # its ratio is against π_roll

    def __post_init__(self) -> None:
        _check_eps(self.eps_low, self.eps_high)


@dataclass
class ReinforceParams:
    """REINFORCE with the unclipped importance ratio: ℓ = −ρ·Â."""


@dataclass
class M2POParams:
    """M2PO: mask the largest squared log-ratios until their second moment is ≤ threshold."""

    threshold: float = 0.04  # τ: the kept tokens' mean squared log-ratio stays <= this
    uses_rollout_ratio: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.threshold <= 0:
            raise ValueError(f"threshold must be > 0, got {self.threshold}")


# ---- IS corrections ----------------------------------------------------------------------

IS_ACTIONS = ("clip", "mask")


@dataclass
class ISParams:
    """Rollout-mismatch IS correction: weight π_old/π_roll, clipped or masked to [lower, upper]."""

    action: str = "clip"  # clip (TIS: truncate the weight) | mask (MIS: drop the token/sequence)
    lower: Optional[float] = None  # None = no lower bound (one-sided TIS)
    upper: float = 2.0  # upper bound of the weight
    uses_rollout_ratio: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.action not in IS_ACTIONS:
            raise ValueError(f"action must be one of {IS_ACTIONS}, got {self.action!r}")
        if self.upper <= 0 or (self.lower is not None and not 0 <= self.lower < self.upper):
            raise ValueError(f"need 0 <= lower < upper, got lower={self.lower}, upper={self.upper}")


@dataclass
class IcePopParams(ISParams):
    """IcePop: token-level two-sided mask, keep π_old/π_roll in [0.5, 5]."""

    action: str = "mask"  # clip | mask
    lower: Optional[float] = 0.5  # lower bound of the weight
    upper: float = 5.0  # upper bound of the weight


@dataclass
class OPSMParams:
    """OPSM: drop negative-advantage sequences whose mean log(π_old/π_θ) exceeds delta."""

    delta: float = 0.1  # bound on the mean log-ratio (slime uses 1e-4)
    uses_rollout_ratio: ClassVar[bool] = False


# ---- data filters ------------------------------------------------------------------------


@dataclass
class DynamicSamplingParams:
    """Dynamic sampling: drop groups whose rewards all tie; redraw up to max_rounds times."""

    max_rounds: int = 8  # draws per step before training on a short batch (verl max_num_gen_batches)
    tolerance: float = 0.0  # rewards within this of each other count as equal

    def __post_init__(self) -> None:
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {self.max_rounds}")


@dataclass
class OverlongParams:
    """Overlong filtering: zero the loss mask of truncated samples (finish_reason=length)."""


@dataclass
class LengthParams:
    """Length filter: drop samples whose response length lies outside [min_tokens, max_tokens]."""

    min_tokens: int = 0  # shortest kept response, in tokens
    max_tokens: Optional[int] = None  # longest kept response, in tokens; None = no upper bound

    def __post_init__(self) -> None:
        if self.min_tokens < 0 or (self.max_tokens is not None and self.max_tokens < self.min_tokens):
            raise ValueError(f"need 0 <= min_tokens <= max_tokens, got {self.min_tokens}, {self.max_tokens}")


@dataclass
class OverlongShapingParams:
    """DAPO overlong reward shaping: linear penalty in the last cache_len tokens before max_len."""

    max_len: int = 20480  # L_max (paper value)
    cache_len: int = 4096  # L_cache (paper value)
    penalty: float = 1.0  # scale of the penalty (1 = paper)

    def __post_init__(self) -> None:
        if not 0 < self.cache_len <= self.max_len:
            raise ValueError(f"need 0 < cache_len <= max_len, got {self.cache_len}, {self.max_len}")
