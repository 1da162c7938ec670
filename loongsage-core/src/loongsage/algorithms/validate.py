"""Check the ``algorithm`` config section and resolve it against the registries.

``validate_algorithm`` is what the config validator calls before any actor starts; it
returns an ``AlgorithmSpec`` (names resolved to callables, parameters typed) that the
objective and ``compute_advantages`` reuse. Every error is a ``ConfigError`` naming the
key and the reason, or an ``UnknownPluginError`` naming the key and the closest name.

Combination rules (each states its reason in the error):
- at most one component may use the rollout/training log-ratio log(π_old/π_roll): M2PO
  masks and reweights by it, the token/sequence/geometric IS corrections reweight by it,
  so combining them corrects one mismatch twice (LS-ref forbids M2PO + IS correction).
  OPSM compares π_θ with π_old and combines with anything;
- ``kl.use_as`` is ``loss`` or ``reward``; ``kl.coef`` ≥ 0;
- ``loss_agg_mode`` is one of ``AGG_MODES``; ``loss_agg_norm_len`` > 0 when set.

``is_correction`` is null, one plugin node, or a list of nodes (e.g. ``[opsm, token]``).
A node is ``{name: ..., <params>}`` or just the name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from loongsage.algorithms.aggregation import AGG_MODES
from loongsage.errors import ConfigError

KL_USES = ("loss", "reward")


@dataclass(frozen=True)
class Component:
    """One resolved plugin: its name, callable and typed parameters."""

    name: str
    fn: Callable[..., Any]
    params: Any
    uses_rollout_ratio: bool = False


@dataclass(frozen=True)
class AlgorithmSpec:
    """The ``algorithm`` section resolved: picklable (callables are module-level)."""

    advantage: Component
    policy_loss: Component
    corrections: tuple[Component, ...]
    kl_method: str
    kl_fn: Callable[..., Any]
    kl_coef: float
    kl_use_as: str
    loss_agg_mode: str
    loss_agg_norm_len: float | None
    filters: tuple[Component, ...] = field(default=())

    @property
    def advantage_fn(self) -> Callable[..., Any]:
        return self.advantage.fn

    @property
    def advantage_params(self) -> Any:
        return self.advantage.params

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

    @classmethod
    def from_config(cls, algorithm_cfg: Any, registries: Any = None) -> "AlgorithmSpec":
        return validate_algorithm(algorithm_cfg, registries)


def _plain(cfg: Any) -> Any:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is a core dependency
        return cfg
    if isinstance(cfg, (DictConfig, ListConfig)):
        return OmegaConf.to_container(cfg, resolve=True)
    return cfg


def split_node(node: Any, key: str) -> tuple[str, dict[str, Any]]:
    """``{name: x, a: 1}`` or ``"x"`` -> ``("x", {"a": 1})``."""
    node = _plain(node)
    if isinstance(node, str):
        return node, {}
    if isinstance(node, dict) and isinstance(node.get("name"), str) and node["name"]:
        params = {k: v for k, v in node.items() if k != "name"}
        return node["name"], params
    raise ConfigError(key, f"expected a plugin node {{name: ..., <params>}} or a name, got {node!r}")


def resolve(registries: Any, kind: str, node: Any, key: str) -> Component:
    """Look up a plugin node in the ``kind`` registry and build its typed parameters."""
    name, values = split_node(node, key)
    entry = registries[kind].entry(name, key)
    try:
        params = entry.build_params(values, key)
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        raise ConfigError(key, f"invalid parameters for {kind} '{name}': {err}") from None
    flag = bool(getattr(entry.params, "uses_rollout_ratio", False))
    return Component(name, entry.obj, params, flag)


def _correction_nodes(node: Any) -> list[tuple[Any, str]]:
    node = _plain(node)
    if node is None:
        return []
    if isinstance(node, list):
        return [(n, f"algorithm.is_correction[{i}]") for i, n in enumerate(node)]
    return [(node, "algorithm.is_correction")]


def _check_rollout_ratio(policy_loss: Component, corrections: list[tuple[Component, str]]) -> None:
    users = [(c, key) for c, key in corrections if c.uses_rollout_ratio]
    if policy_loss.uses_rollout_ratio and users:
        comp, key = users[0]
        raise ConfigError(
            key,
            f"is_correction '{comp.name}' cannot be combined with policy_loss "
            f"'{policy_loss.name}': both use the rollout/training ratio π_old/π_roll, so the "
            f"mismatch would be corrected twice (M2PO already masks and reweights by it). "
            f"Drop the IS correction or choose another policy loss; OPSM is allowed.",
        )
    if len(users) > 1:
        raise ConfigError(
            users[1][1],
            f"is_correction '{users[1][0].name}' and '{users[0][0].name}' both reweight by "
            f"π_old/π_roll; use at most one of them",
        )


def validate_algorithm(algorithm_cfg: Any, registries: Any = None) -> AlgorithmSpec:
    """Validate the ``algorithm`` section; return it resolved, or raise ``ConfigError``."""
    if registries is None:
        from loongsage.plugins import get_registries

        registries = get_registries()
    cfg = _plain(algorithm_cfg) or {}
    if not isinstance(cfg, dict):
        raise ConfigError("algorithm", f"expected a mapping, got {type(cfg).__name__}")

    advantage = resolve(registries, "advantage", cfg.get("advantage_estimator", "grpo"),
                        "algorithm.advantage_estimator")
    policy_loss = resolve(registries, "policy_loss", cfg.get("policy_loss", "ppo_clip"),
                          "algorithm.policy_loss")
    corrections = [(resolve(registries, "is_correction", n, key), key)
                   for n, key in _correction_nodes(cfg.get("is_correction"))]
    _check_rollout_ratio(policy_loss, corrections)
    filters = tuple(resolve(registries, "data_filter", n, f"algorithm.filters[{i}]")
                    for i, n in enumerate(cfg.get("filters") or []))

    mode = cfg.get("loss_agg_mode", "token_mean")
    if mode not in AGG_MODES:
        raise ConfigError("algorithm.loss_agg_mode", f"must be one of {', '.join(AGG_MODES)}; got {mode!r}")
    norm_len = cfg.get("loss_agg_norm_len")
    if norm_len is not None and not norm_len > 0:
        raise ConfigError("algorithm.loss_agg_norm_len", f"must be > 0 (or null), got {norm_len!r}")

    kl = cfg.get("kl") or {}
    method = kl.get("method", "k3")
    kl_fn = registries.kl_policy.get(method, "algorithm.kl.method")
    coef = float(kl.get("coef", 0.0))
    if coef < 0:
        raise ConfigError("algorithm.kl.coef", f"must be >= 0, got {coef}")
    use_as = kl.get("use_as", "loss")
    if use_as not in KL_USES:
        raise ConfigError("algorithm.kl.use_as", f"must be one of {KL_USES}, got {use_as!r}")

    return AlgorithmSpec(
        advantage=advantage,
        policy_loss=policy_loss,
        corrections=tuple(c for c, _ in corrections),
        kl_method=method,
        kl_fn=kl_fn,
        kl_coef=coef,
        kl_use_as=use_as,
        loss_agg_mode=mode,
        loss_agg_norm_len=float(norm_len) if norm_len is not None else None,
        filters=filters,
    )
