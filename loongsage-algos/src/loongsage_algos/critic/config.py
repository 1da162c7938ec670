"""``algorithm.critic``: the value model's settings, validated into a ``CriticSpec``.

The section is the step term ``critic``'s (``step``), nested in core's ``algorithm`` section
(``loongsage.plugin.StepTermPlugin``). It is used when the run's advantage estimator reads
per-token values (its parameters declare ``needs_values``: ``gae``); otherwise it is ignored
and no value model starts. Rules, each refused with the key:

- ``lr > 0``, ``value_clip > 0``, ``warmup_steps >= 0``, ``updates_per_step >= 1``;
- ``backend`` names an engine plugin (core's registry resolves it, with a "did you mean");
- a KL reward penalty (``algorithm.kl.use_as=reward`` with ``coef > 0``) is refused: the value
  targets are computed without the penalty, so the policy and the value model would see
  different rewards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from loongsage.plugin import ConfigError, PluginRef, Registries


@dataclass
class CriticConfig:
    """The value model of a values-based estimator (``gae``): its own engine, actor and optimizer."""

    backend: str = "embedded_critic"  # engine plugin hosting the value model
    path: Optional[str] = None  # initial weights: null = the policy's model.path; a saved critic keeps its head
    lr: float = 1e-5  # the critic's AdamW learning rate (its other optimizer settings are train's)
    value_clip: float = 0.5  # ε_v of the clipped value loss; V moves at most this far from V_old per step
    warmup_steps: int = 0  # first steps train only the critic (the policy waits)
    updates_per_step: int = 1  # critic optimizer passes over each step's batch (SAO: 2)
    freeze_attention: bool = False  # train only the MLPs, norms, embeddings and head (SAO)


@dataclass(frozen=True)
class CriticSpec:
    """``algorithm.critic`` resolved: the value model's engine and its settings."""

    engine: PluginRef
    settings: CriticConfig


CRITIC_RANGES = {
    "lr": (lambda v: v > 0, "a positive learning rate"),
    "value_clip": (lambda v: v > 0, "> 0"),
    "warmup_steps": (lambda v: v >= 0, ">= 0"),
    "updates_per_step": (lambda v: v >= 1, ">= 1"),
}


def validate_critic(cfg: Any, registries: Registries) -> CriticSpec | None:
    """``algorithm.critic`` when the run's advantage estimator reads values, else None."""
    algorithm = cfg.get("algorithm") or {}
    advantage = registries.resolve("advantage", algorithm.get("advantage_estimator", "grpo"),
                                   "algorithm.advantage_estimator")
    if not advantage.flag("needs_values"):
        return None
    node = algorithm.get("critic") or {}
    values = dict(node.items()) if hasattr(node, "items") else {}
    try:
        settings = CriticConfig(**values)
    except TypeError as err:
        raise ConfigError("algorithm.critic", f"does not match CriticConfig: {err}") from None
    for key, (ok, expected) in CRITIC_RANGES.items():
        if not ok(getattr(settings, key)):
            raise ConfigError(f"algorithm.critic.{key}", f"expected {expected}, got {getattr(settings, key)!r}")
    kl = algorithm.get("kl") or {}
    if kl.get("use_as", "loss") == "reward" and float(kl.get("coef", 0.0)) > 0:
        raise ConfigError(
            "algorithm.kl.use_as",
            f"estimator '{advantage.name}' trains a critic on returns computed without the KL "
            "penalty, so kl.use_as=reward would give the policy and the critic different rewards; "
            "use kl.use_as=loss with a critic",
        )
    engine = registries.resolve("engine", settings.backend, "algorithm.critic.backend")
    return CriticSpec(engine, settings)
