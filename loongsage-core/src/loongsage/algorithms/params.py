"""Typed parameters of core's built-in algorithms (torch-free, so ``plugin.py`` stays cheap).

Each dataclass is what a config node next to the plugin's ``name`` may set, e.g.
``algorithm.policy_loss: {name: ppo_clip, eps_high: 0.28, dual_clip: 3.0}``. The registry
publishes them to Hydra's ConfigStore, so Hydra validates the keys and types.

``uses_rollout_ratio`` (a class variable, not a config key) marks components that already
use the rollout/training log-ratio log(π_old/π_roll); ``validate_algorithm`` rejects two
such components in one objective (they would correct the same mismatch twice).

A KL policy declares, the same way, what it may be used as (``kl_roles``: ``penalty``, a
detached per-token value, and/or ``loss``, a differentiable one), for the plugins that
choose among KL policies (docs/plugins.md, kl_policy). k1's gradient is zero in
expectation, so it is a penalty only; k2, k3 and their variants are losses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

KL_ROLES = ("penalty", "loss")


@dataclass
class KLPenaltyParams:
    """k1: the sampled token's log-ratio, an unbiased KL value to use detached (a penalty)."""

    kl_roles: ClassVar[tuple[str, ...]] = ("penalty",)


@dataclass
class KLLossParams:
    """A per-token KL estimator on sampled-token log-probs whose gradient makes it a loss."""

    kl_roles: ClassVar[tuple[str, ...]] = ("loss",)


GRPO_NORM_MODES = ("group_zscore", "group_mean", "batch_zscore", "batch_mean", "none")


@dataclass
class GRPOParams:
    """GRPO: group-relative outcome advantage, with five normalisation modes."""

    norm_mode: str = "group_zscore"  # group_zscore | group_mean | batch_zscore | batch_mean | none
    eps: float = 1e-6  # added to the standard deviation
    std_unbiased: bool = True  # Bessel-corrected std (torch.std default, as in verl)

    @property
    def group_baseline(self) -> bool:
        """Whether each sample is baselined by its prompt group (a group of one gives Â = 0)."""
        return self.norm_mode.startswith("group")

    def __post_init__(self) -> None:
        if self.norm_mode not in GRPO_NORM_MODES:
            raise ValueError(f"norm_mode must be one of {GRPO_NORM_MODES}, got {self.norm_mode!r}")
        if self.eps < 0:
            raise ValueError(f"eps must be >= 0, got {self.eps}")


@dataclass
class GAEParams:
    """GAE: advantages from per-token values (a step term supplies them: a value model)."""

    gamma: float = 1.0  # discount per sampled token
    lam: float = 1.0  # GAE λ: 1 = Monte-Carlo returns minus V, 0 = one-step TD
    whiten: bool = True  # whiten the advantages over every loss token of the batch

    needs_values: ClassVar[bool] = True  # the estimator reads per-token values

    def __post_init__(self) -> None:
        if not 0 < self.gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")
        if not 0 <= self.lam <= 1:
            raise ValueError(f"lam must be in [0, 1], got {self.lam}")


@dataclass
class PPOClipParams:
    """PPO-clip with asymmetric clip-higher bounds and an optional dual-clip constant."""

    eps_low: float = 0.2  # ratio lower bound 1 - eps_low
    eps_high: float = 0.28  # ratio upper bound 1 + eps_high (DAPO clip-higher)
    dual_clip: Optional[float] = 3.0  # c > 1 caps the loss of negative-advantage tokens; null disables

    def __post_init__(self) -> None:
        if not 0 <= self.eps_low < 1:
            raise ValueError(f"eps_low must be in [0, 1), got {self.eps_low}")
        if self.eps_high < 0:
            raise ValueError(f"eps_high must be >= 0, got {self.eps_high}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1 (or null to disable), got {self.dual_clip}")

    uses_rollout_ratio: ClassVar[bool] = False
