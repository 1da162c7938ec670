"""Check the ``algorithm`` config section and resolve it against the registries.

``validate_algorithm`` is what the config validator calls before any actor starts; it
returns an ``AlgorithmSpec`` (every plugin resolved once into a ``PluginRef`` with typed
parameters) that the objective holds and ``compute_advantages`` receives: nothing
re-derives it later, in the controller or in the train actor. Every error is a
``ConfigError`` naming the key and the reason, or an ``UnknownPluginError`` naming the key
and the closest name.

Combination rules (each states its reason in the error):
- at most one component may use the rollout/training log-ratio log(π_old/π_roll): M2PO
  masks and reweights by it, the token/sequence/geometric IS corrections reweight by it,
  so combining them corrects one mismatch twice (baidu-baige/LoongSage forbids M2PO + IS
  correction). OPSM compares π_θ with π_old and combines with anything;
- ``kl.use_as`` is ``loss`` or ``reward``; ``kl.coef`` ≥ 0;
- ``loss_agg_mode`` is one of ``AGG_MODES``; ``loss_agg_norm_len`` > 0 when set.

An estimator with ``needs_values`` (``gae``) reads per-token values that a step term supplies
(``config.step_terms``); that term validates its own section.

``is_correction`` is null, one plugin node, or a list of nodes (e.g. ``[opsm, token]``).
A node is ``{name: ..., <params>}`` or just the name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from omegaconf import ListConfig

from loongsage.errors import ConfigError
from loongsage.registry import PluginRef, Registries
from loongsage.schema import AGG_MODES

KL_USES = ("loss", "reward")


@dataclass(frozen=True)
class AlgorithmSpec:
    """The ``algorithm`` section resolved: picklable (callables are module-level)."""

    advantage: PluginRef
    policy_loss: PluginRef
    corrections: tuple[PluginRef, ...]
    kl: PluginRef
    kl_coef: float
    kl_use_as: str
    loss_agg_mode: str
    loss_agg_norm_len: float | None
    filters: tuple[PluginRef, ...] = field(default=())

    @property
    def kl_method(self) -> str:
        return self.kl.name

    @property
    def kl_fn(self) -> Callable[..., Any]:
        return self.kl.obj

    @property
    def kl_as_loss(self) -> bool:
        return self.kl_use_as == "loss" and self.kl_coef > 0

    @property
    def kl_as_reward(self) -> bool:
        return self.kl_use_as == "reward" and self.kl_coef > 0

    @property
    def needs_reference(self) -> bool:
        """Whether the train engine must compute reference-model logprobs."""
        return self.kl_coef > 0

    @property
    def needs_old_logprobs_before_loss(self) -> bool:
        """Whether π_old is read before the loss forward: by a KL penalty in the reward, or
        by a component's batch-level ``prepare`` (M2PO's mask)."""
        components = (self.policy_loss, *self.corrections)
        return self.kl_as_reward or any(getattr(c.obj, "prepare", None) is not None for c in components)


def _corrections(registries: Registries, node: Any) -> tuple[PluginRef, ...]:
    """``algorithm.is_correction``: null, one plugin node, or a list of them."""
    if isinstance(node, (list, ListConfig)):
        return registries.resolve_all("is_correction", node)
    if node is None:
        return ()
    return (registries.resolve("is_correction", node),)


def _check_rollout_ratio(policy_loss: PluginRef, corrections: tuple[PluginRef, ...]) -> None:
    users = [c for c in corrections if c.flag("uses_rollout_ratio")]
    if policy_loss.flag("uses_rollout_ratio") and users:
        comp = users[0]
        raise ConfigError(
            comp.key,
            f"is_correction '{comp.name}' cannot be combined with policy_loss "
            f"'{policy_loss.name}': both use the rollout/training ratio π_old/π_roll, so the "
            f"mismatch would be corrected twice (M2PO already masks and reweights by it). "
            f"Drop the IS correction or choose another policy loss; OPSM is allowed.",
        )
    if len(users) > 1:
        raise ConfigError(
            users[1].key,
            f"is_correction '{users[1].name}' and '{users[0].name}' both reweight by "
            f"π_old/π_roll; use at most one of them",
        )


def validate_algorithm(algorithm_cfg: Any, registries: Registries) -> AlgorithmSpec:
    """Validate the ``algorithm`` section; return it resolved, or raise ``ConfigError``."""
    cfg = algorithm_cfg if algorithm_cfg is not None else {}
    if not isinstance(cfg, Mapping):
        raise ConfigError("algorithm", f"expected a mapping, got {type(cfg).__name__}")

    advantage = registries.resolve("advantage", cfg.get("advantage_estimator", "grpo"))
    policy_loss = registries.resolve("policy_loss", cfg.get("policy_loss", "ppo_clip"))
    corrections = _corrections(registries, cfg.get("is_correction"))
    _check_rollout_ratio(policy_loss, corrections)
    filters = registries.resolve_all("data_filter", cfg.get("filters"))

    mode = cfg.get("loss_agg_mode", "token_mean")
    if mode not in AGG_MODES:
        raise ConfigError("algorithm.loss_agg_mode", f"must be one of {', '.join(AGG_MODES)}; got {mode!r}")
    norm_len = cfg.get("loss_agg_norm_len")
    if norm_len is not None and not norm_len > 0:
        raise ConfigError("algorithm.loss_agg_norm_len", f"must be > 0 (or null), got {norm_len!r}")

    kl = cfg.get("kl") or {}
    method = registries.resolve("kl_policy", kl.get("method", "k3"))
    coef = float(kl.get("coef", 0.0))
    if coef < 0:
        raise ConfigError("algorithm.kl.coef", f"must be >= 0, got {coef}")
    use_as = kl.get("use_as", "loss")
    if use_as not in KL_USES:
        raise ConfigError("algorithm.kl.use_as", f"must be one of {KL_USES}, got {use_as!r}")

    return AlgorithmSpec(
        advantage=advantage,
        policy_loss=policy_loss,
        corrections=corrections,
        kl=method,
        kl_coef=coef,
        kl_use_as=use_as,
        loss_agg_mode=mode,
        loss_agg_norm_len=float(norm_len) if norm_len is not None else None,
        filters=filters,
    )
