"""Validation of a composed config, before any actor starts.

Three layers, each error naming the key: the typed schema (types, enforced by OmegaConf
when the recipe is merged over it), ranges and choices of single fields, and cross-field
rules (invalid mode combinations). Every plugin-bound field is resolved against its
registry and its parameters are validated by the plugin's own dataclass; the resolved
parameters, defaults included, are written back so ``config show`` prints all of them.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from loongsage.config.store import data_source_schema, root_schema
from loongsage.errors import ConfigError
from loongsage.hints import closest, first_leaf_key, omegaconf_error, unknown_key_error
from loongsage.registry import Registries

CHOICES: dict[str, tuple[str, ...]] = {
    "model.dtype": ("float32", "bfloat16", "float16"),
    "placement.mode": ("colocated", "disaggregated"),
    "algorithm.kl.use_as": ("loss", "reward"),
    "algorithm.loss_agg_mode": (
        "token_mean",
        "seq_mean_token_mean",
        "seq_mean_token_sum",
        "seq_mean_token_sum_norm",
    ),
}

# key -> (predicate, what is expected)
RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "train.lr": (lambda v: v > 0, "a positive learning rate"),
    "train.grad_clip": (lambda v: v >= 0, ">= 0 (0 disables clipping)"),
    "train.micro_batch_size": (lambda v: v >= 1, ">= 1"),
    "train.mini_batches_per_step": (lambda v: v >= 1, ">= 1"),
    "rollout.num_engines": (lambda v: v >= 1, ">= 1"),
    "rollout.prompts_per_step": (lambda v: v >= 1, ">= 1"),
    "rollout.n_samples_per_prompt": (lambda v: v >= 1, ">= 1"),
    "rollout.max_new_tokens": (lambda v: v >= 1, ">= 1"),
    "rollout.temperature": (lambda v: v >= 0, ">= 0"),
    "rollout.top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "rollout.top_k": (lambda v: v == -1 or v >= 1, "-1 (off) or >= 1"),
    "rollout.oversample_groups": (lambda v: v >= 0, ">= 0"),
    "algorithm.kl.coef": (lambda v: v >= 0, ">= 0"),
    "async.stale_steps": (lambda v: v >= 0, ">= 0"),
    "opd.pg_ratio": (lambda v: v >= 0, ">= 0"),
    "opd.gkd_ratio": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "trainer.steps": (lambda v: v >= 0, ">= 0"),
    "checkpoint.interval": (lambda v: v >= 0, ">= 0"),
    "checkpoint.keep_last": (lambda v: v >= 1, ">= 1"),
}


def _typed(cfg: DictConfig) -> DictConfig:
    """Merge the config over the typed schema: wrong types and unknown keys fail here.

    The config is merged as plain containers: a composed node already carrying its section's
    dataclass type would pass a key added with Hydra's ``+`` through the merge unchecked.
    """
    schema = root_schema()
    plain = OmegaConf.to_container(cfg, resolve=False)
    known = OmegaConf.to_container(schema, resolve=False)
    for key, value in plain.items():
        if key not in known:
            raise unknown_key_error(first_leaf_key(key, value), known, typed=True)
        if not isinstance(value, type(known[key])):
            shape = "list" if isinstance(known[key], list) else "mapping"
            raise ConfigError(key, f"expected a {shape}, got {value!r}")
    sources = plain.pop("data_sources", None) or []
    for i, source in enumerate(sources):
        if not isinstance(source, dict):
            raise ConfigError(f"data_sources[{i}]", f"expected a mapping, got {source!r}")
    merged = _merge_over(schema, plain, known)
    source_keys = OmegaConf.to_container(data_source_schema(), resolve=False)
    merged.data_sources = [
        _merge_over(data_source_schema(), source, source_keys, f"data_sources[{i}]")
        for i, source in enumerate(sources)
    ]
    return merged


def _merge_over(schema: DictConfig, values: Any, known: Any, prefix: str = "") -> DictConfig:
    try:
        return OmegaConf.merge(schema, values)
    except OmegaConfBaseException as err:
        raise omegaconf_error(err, known, prefix=prefix) from None


def _missing_keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    return sorted(prefix + k for k in OmegaConf.missing_keys(cfg))


def _check_fields(cfg: DictConfig) -> None:
    for key, choices in CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in choices:
            match = closest(str(value), choices)
            hint = f"; did you mean {match!r}?" if match else ""
            raise ConfigError(key, f"expected one of {', '.join(choices)}, got {value!r}{hint}")
    for key, (ok, expected) in RANGES.items():
        value = OmegaConf.select(cfg, key)
        if not ok(value):
            raise ConfigError(key, f"expected {expected}, got {value!r}")


def _check_modes(cfg: DictConfig) -> None:
    asynchronous, mode = cfg["async"].enable, cfg.placement.mode
    if asynchronous and mode != "disaggregated":
        raise ConfigError(
            "async.enable",
            "the fully asynchronous runtime overlaps rollout and training on separate "
            "resources; set placement.mode=disaggregated (colocated mode time-shares devices)",
        )
    if mode == "disaggregated" and not asynchronous:
        raise ConfigError(
            "placement.mode",
            "disaggregated placement without async.enable=true leaves rollout and training "
            "resources idle in turn; use colocated (optionally rollout.partial=true) or enable async",
        )
    if cfg.rollout.mask_offpolicy_in_partial_rollout and not (cfg.rollout.partial or asynchronous):
        raise ConfigError(
            "rollout.mask_offpolicy_in_partial_rollout",
            "only meaningful with rollout.partial=true or async.enable=true",
        )
    filtered = bool(cfg.algorithm.filters) or any(s.get("filters") for s in cfg.data_sources)
    if filtered and (asynchronous or cfg.rollout.partial):
        raise ConfigError(
            "algorithm.filters",
            "data filters run in the synchronous scheduler only; the asynchronous runtime "
            "(async.enable or rollout.partial) does not apply them yet",
        )
    if cfg.opd.gkd_ratio == 1 and cfg.opd.pg_ratio > 0:
        raise ConfigError(
            "opd.pg_ratio", "a PG distillation term has no effect when opd.gkd_ratio=1 (no RL loss)"
        )
    samples = cfg.rollout.prompts_per_step * cfg.rollout.n_samples_per_prompt
    if samples % cfg.train.mini_batches_per_step:
        raise ConfigError(
            "train.mini_batches_per_step",
            f"must divide the {samples} samples of a step (rollout.prompts_per_step x "
            f"rollout.n_samples_per_prompt)",
        )


def _resolve_ref(node: Any, kind: str, key: str, registries: Registries, name_field: str = "name") -> Any:
    """Validate one plugin reference (a bare name or {name_field: ..., params}) in place."""
    if isinstance(node, str):
        node = {name_field: node}
    if not isinstance(node, (dict, DictConfig)) or name_field not in node:
        raise ConfigError(key, f"expected a {kind} name or a mapping with '{name_field}', got {node!r}")
    values = OmegaConf.to_container(node) if isinstance(node, DictConfig) else dict(node)
    name = values.pop(name_field)
    entry = registries[kind].entry(name, f"{key}.{name_field}")
    params = entry.build_params(values, key)
    resolved = dataclasses.asdict(params) if params is not None else {}
    return {name_field: name, **resolved}


def _resolve_plugins(cfg: DictConfig, registries: Registries) -> None:
    alg = cfg.algorithm
    alg.advantage_estimator = _resolve_ref(alg.advantage_estimator, "advantage", "algorithm.advantage_estimator", registries)
    alg.policy_loss = _resolve_ref(alg.policy_loss, "policy_loss", "algorithm.policy_loss", registries)
    if isinstance(alg.is_correction, ListConfig):
        alg.is_correction = [
            _resolve_ref(c, "is_correction", f"algorithm.is_correction[{i}]", registries)
            for i, c in enumerate(alg.is_correction)
        ]
    elif alg.is_correction is not None:
        alg.is_correction = _resolve_ref(alg.is_correction, "is_correction", "algorithm.is_correction", registries)
    alg.filters = [
        _resolve_ref(f, "data_filter", f"algorithm.filters[{i}]", registries) for i, f in enumerate(alg.filters)
    ]
    registries.kl_policy.entry(alg.kl.method, "algorithm.kl.method")
    registries.kl_policy.entry(cfg.opd.pg_kl_method, "opd.pg_kl_method")
    registries.kl_policy.entry(cfg.opd.gkd_kl_method, "opd.gkd_kl_method")
    cfg["async"].window_policy = _resolve_ref(cfg["async"].window_policy, "window_policy", "async.window_policy", registries)
    registries.engine.entry(cfg.train.backend, "train.backend")
    registries.engine.entry(cfg.rollout.backend, "rollout.backend")
    registries.tool_parser.entry(cfg.agentflow.tool_parser, "agentflow.tool_parser")
    cfg.agentflow.middlewares = [
        _resolve_ref(m, "router_middleware", f"agentflow.middlewares[{i}]", registries)
        for i, m in enumerate(cfg.agentflow.middlewares)
    ]
    cfg.logging.trackers = [
        _resolve_ref(t, "tracker", f"logging.trackers[{i}]", registries) for i, t in enumerate(cfg.logging.trackers)
    ]
    for i, source in enumerate(cfg.data_sources):
        key = f"data_sources[{i}]"
        source.dataset = _resolve_ref(source.dataset, "dataset", f"{key}.dataset", registries, "format")
        source.agent = _resolve_ref(source.agent, "agent", f"{key}.agent", registries)
        source.reward = _resolve_ref(source.reward, "reward", f"{key}.reward", registries)
        if source.sandbox is not None:
            source.sandbox = _resolve_ref(source.sandbox, "sandbox", f"{key}.sandbox", registries, "type")
        source.filters = [
            _resolve_ref(f, "data_filter", f"{key}.filters[{j}]", registries) for j, f in enumerate(source.filters)
        ]


def _check_data_sources(cfg: DictConfig) -> None:
    if not cfg.data_sources:
        raise ConfigError("data_sources", "at least one data source is required")
    seen: set[str] = set()
    for i, source in enumerate(cfg.data_sources):
        if source.name in seen:
            raise ConfigError(f"data_sources[{i}].name", f"duplicate data source name {source.name!r}")
        seen.add(source.name)
        if not source.weight > 0:
            raise ConfigError(f"data_sources[{i}].weight", f"expected a positive proportion, got {source.weight}")


def _check_agents(cfg: DictConfig, registries: Registries) -> None:
    """Partial rollout needs agents that can continue an aborted sample (``continue_sample``)."""
    if not cfg.rollout.partial:
        return
    for i, source in enumerate(cfg.data_sources):
        name = source.agent["name"]
        if not hasattr(registries.agent.get(name), "continue_sample"):
            raise ConfigError(
                f"data_sources[{i}].agent",
                f"agent {name!r} cannot continue a sample aborted at a weight update (it has no "
                "continue_sample: a router-based agent's program has exited by then), which "
                "rollout.partial=true needs; set rollout.partial=false (async runs without "
                "partial rollout let in-flight trajectories finish instead)",
            )


def _algorithm_rules(cfg: DictConfig, registries: Registries) -> None:
    """Cross-field algorithm rules live with the algorithms (M2PO vs IS correction, ...)."""
    try:
        module = importlib.import_module("loongsage.algorithms.validate")
    except ModuleNotFoundError:
        return
    module.validate_algorithm(cfg.algorithm, registries)


def validate_config(cfg: DictConfig, registries: Registries) -> DictConfig:
    """Return the typed, resolved config or raise ``ConfigError``/``UnknownPluginError``."""
    cfg = _typed(cfg)
    missing = _missing_keys(cfg)
    for i, source in enumerate(cfg.data_sources):
        missing += _missing_keys(source, f"data_sources[{i}].")
    if missing:
        raise ConfigError(missing[0], f"required value missing (all missing: {', '.join(missing)})")
    _check_fields(cfg)
    _check_modes(cfg)
    _check_data_sources(cfg)
    _resolve_plugins(cfg, registries)
    _check_agents(cfg, registries)
    _algorithm_rules(cfg, registries)
    return cfg


def as_container(cfg: DictConfig | ListConfig) -> Any:
    """Plain Python containers of a config (for pickling into actors and writing to disk)."""
    return OmegaConf.to_container(cfg, resolve=True)
