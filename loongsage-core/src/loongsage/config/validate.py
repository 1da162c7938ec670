"""Validation of a composed config, before any actor starts.

Three layers, each error naming the key: the typed schema (types, enforced by OmegaConf
when the recipe is merged over it), ranges and choices of single fields, and cross-field
rules (invalid mode combinations); the train backend's keys and optional packages
(``backend_support``). Every plugin-bound field is resolved once against its
registry (``Registries.resolve``) and its parameters are validated by the plugin's own
dataclass; ``validate_config`` returns them in a ``RunConfig``, and writes the resolved
parameters, defaults included, back into the config so ``config show`` prints all of them.
A reward node's generic keys (``timeout_s``, ``on_error``) default to the ``reward`` section
and are checked by the same rules as its keys. A source naming an environment gets its
dataset, agent and reward bound to it (``loongsage.data.environments``); naming both is
refused. The ``budgets`` section's limits travel in each ``SourceSpec``. The sections of the
installed step terms are validated by their plugins (``config.step_terms``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from loongsage.algorithms.lr_schedule import LR_DECAYS
from loongsage.algorithms.validate import AlgorithmSpec, validate_algorithm
from loongsage.config.backend_support import (check_backend_keys, check_environment_library,
                                              check_optional_packages)
from loongsage.config.router_plugins import RouterPlugins, router_plugins
from loongsage.config.step_terms import ActiveTerm, validate_step_terms
from loongsage.config.store import data_source_schema, root_schema
from loongsage.data.environments import EnvironmentOptions, bind_environment
from loongsage.data.sources import SourceSpec
from loongsage.deadline.budget import Budget
from loongsage.errors import ConfigError
from loongsage.hints import closest, first_leaf_key, omegaconf_error, unknown_key_error
from loongsage.kind_table import KINDS
from loongsage.registry import PluginRef, Registries
from loongsage.schema import RewardOptions

PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")

CHOICES: dict[str, tuple[str, ...]] = {
    "model.dtype": ("float32", "bfloat16", "float16"),
    "placement.mode": ("colocated", "disaggregated"),
    "placement.train_strategy": PLACEMENT_STRATEGIES,
    "placement.rollout_strategy": PLACEMENT_STRATEGIES,
    "train.strategy": ("ddp", "fsdp2"),
    "algorithm.kl.use_as": ("loss", "reward"),
    "reward.on_error": ("zero", "drop_group", "fail"),
    "rollout.failed_trajectory": ("zero_reward", "drop_group"),
    "rollout.long_prompts": ("refuse", "drop"),
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
    "train.max_tokens_per_micro_batch": (lambda v: v >= 0, ">= 0 (0: train.micro_batch_size rows)"),
    "train.mini_batches_per_step": (lambda v: v >= 1, ">= 1"),
    "train.dp_size": (lambda v: v >= 1, ">= 1"),
    "placement.train_cpus": (lambda v: v > 0, "> 0"),
    "placement.rollout_cpus": (lambda v: v > 0, "> 0"),
    "placement.gpus_per_node": (lambda v: v >= 0, ">= 0 (0 = CPU bundles)"),
    "placement.nodes": (lambda v: v >= 1, ">= 1"),
    "placement.timeout_s": (lambda v: v > 0, "> 0 seconds"),
    "rollout.num_engines": (lambda v: v >= 1, ">= 1"),
    "rollout.prompts_per_step": (lambda v: v >= 1, ">= 1"),
    "rollout.n_samples_per_prompt": (lambda v: v >= 1, ">= 1"),
    "rollout.max_new_tokens": (lambda v: v >= 1, ">= 1"),
    "rollout.temperature": (lambda v: v >= 0, ">= 0"),
    "rollout.top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "rollout.top_k": (lambda v: v == -1 or v >= 1, "-1 (off) or >= 1"),
    "rollout.oversample_groups": (lambda v: v >= 0, ">= 0"),
    "rollout.prefix_cache_gb": (lambda v: v >= 0, ">= 0 GiB (0 turns the prefix cache off)"),
    "algorithm.kl.coef": (lambda v: v >= 0, ">= 0"),
    "async.stale_steps": (lambda v: v >= 0, ">= 0"),
    "trainer.steps": (lambda v: v >= 0, ">= 0"),
    "checkpoint.interval": (lambda v: v >= 0, ">= 0"),
    "checkpoint.keep_last": (lambda v: v >= 1, ">= 1"),
    "reward.timeout_s": (lambda v: v > 0, "a positive number of seconds"),
    "reward.workers": (lambda v: v >= 0, ">= 0 (0 = one per available core)"),
    "reward.drop_group_retries": (lambda v: v >= 0, ">= 0"),
    "budgets.dataset_load_s": (lambda v: v > 0, "a positive number of seconds"),
    "budgets.dataset_get_s": (lambda v: v > 0, "a positive number of seconds"),
    "budgets.filter_s": (lambda v: v > 0, "a positive number of seconds"),
    "budgets.prompt_check_s": (lambda v: v > 0, "a positive number of seconds"),
    "rollout.max_prompt_tokens": (lambda v: v >= 1, ">= 1"),
}


def _typed(cfg: DictConfig, registries: Registries) -> DictConfig:
    """Merge the config over the typed schema: wrong types and unknown keys fail here.

    The config is merged as plain containers: a composed node already carrying its section's
    dataclass type would pass a key added with Hydra's ``+`` through the merge unchecked.
    """
    schema = root_schema(registries)
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
    source_keys = OmegaConf.to_container(data_source_schema(registries), resolve=False)
    merged.data_sources = [
        _merge_over(data_source_schema(registries), source, source_keys, f"data_sources[{i}]")
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


def _check_value(key: str, rule: str, value: Any) -> None:
    """Check ``value`` against the ``CHOICES`` / ``RANGES`` entry ``rule``; errors name ``key``."""
    if rule in CHOICES and value not in CHOICES[rule]:
        choices = CHOICES[rule]
        match = closest(str(value), choices)
        hint = f"; did you mean {match!r}?" if match else ""
        raise ConfigError(key, f"expected one of {', '.join(choices)}, got {value!r}{hint}")
    if rule in RANGES and not RANGES[rule][0](value):
        raise ConfigError(key, f"expected {RANGES[rule][1]}, got {value!r}")


def _check_fields(cfg: DictConfig) -> None:
    for key in (*CHOICES, *RANGES):
        _check_value(key, key, OmegaConf.select(cfg, key))


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
    if cfg.trainer.resume and cfg.trainer.overwrite:
        raise ConfigError("trainer.overwrite", "deletes the previous run's files, which trainer.resume=true "
                          "resumes from; set one of them")
    if cfg.rollout.mask_offpolicy_in_partial_rollout and not (cfg.rollout.partial or asynchronous):
        raise ConfigError(
            "rollout.mask_offpolicy_in_partial_rollout",
            "only meaningful with rollout.partial=true or async.enable=true",
        )
    if cfg.rollout.prefix_cache.keep_on_update and cfg.rollout.backend != "embedded_rollout":
        raise ConfigError(
            "rollout.prefix_cache.keep_on_update",
            f"applies to the embedded engine only; rollout.backend={cfg.rollout.backend} flushes its "
            "cache at every weight update (SGLang: the update's flush_cache)",
        )
    filtered = bool(cfg.algorithm.filters) or any(s.get("filters") for s in cfg.data_sources)
    if filtered and (asynchronous or cfg.rollout.partial or cfg.rollout.oversample_groups):
        raise ConfigError(
            KINDS["data_filter"].key(),
            "data filters run in the synchronous scheduler only; the pipeline scheduler that "
            "async.enable, rollout.partial and rollout.oversample_groups use does not apply them "
            "yet (for DAPO-style dynamic sampling use a filter's max_rounds instead of oversampling)",
        )


def _check_shapes(cfg: DictConfig) -> None:
    """Batches must cut into equal shards of whole groups, and the ranks fit the GPUs declared."""
    groups, minis, dp = cfg.rollout.prompts_per_step, cfg.train.mini_batches_per_step, cfg.train.dp_size
    if groups % (minis * dp):
        raise ConfigError(
            "rollout.prompts_per_step",
            f"{groups} prompt groups cannot be cut into train.mini_batches_per_step={minis} x "
            f"train.dp_size={dp} equal shards of whole groups; use a multiple of {minis * dp}",
        )
    model_parallel = {k: v for k, v in cfg.train.megatron.items() if v != 1}
    if model_parallel and cfg.train.backend != "megatron":
        raise ConfigError("train.megatron", f"{model_parallel} applies to train.backend=megatron "
                          f"only, not {cfg.train.backend!r}")
    sft = cfg.trainer.sft
    if sft.steps > 0 and sft.batch_size % dp:
        raise ConfigError(
            "trainer.sft.batch_size",
            f"{sft.batch_size} examples cannot be split evenly over train.dp_size={dp} ranks; "
            f"use a multiple of {dp}",
        )
    if sft.lr_decay not in LR_DECAYS:
        raise ConfigError("trainer.sft.lr_decay", f"expected one of {sorted(LR_DECAYS)}, got {sft.lr_decay!r}")
    if sft.warmup_steps < 0 or 0 < sft.steps < sft.warmup_steps:  # steps=0: no warm start to warm up
        raise ConfigError("trainer.sft.warmup_steps", f"must be in [0, trainer.sft.steps={sft.steps}], "
                          f"got {sft.warmup_steps}")
    placement, engines = cfg.placement, cfg.rollout.num_engines
    if placement.gpus_per_node > 0:
        gpus = placement.gpus_per_node * placement.nodes
        colocated = placement.mode == "colocated"
        need = max(dp, engines) if colocated else dp + engines
        if need > gpus:
            layout = "max(train.dp_size, rollout.num_engines)" if colocated else (
                "train.dp_size + rollout.num_engines")
            raise ConfigError(
                "placement.gpus_per_node",
                f"{placement.mode} placement needs {layout} = {need} GPUs, but "
                f"placement.nodes={placement.nodes} x placement.gpus_per_node="
                f"{placement.gpus_per_node} declares {gpus}",
            )


@dataclass(frozen=True)
class RunConfig:
    """A validated config and every plugin it names, each resolved exactly once.

    ``cfg`` is the typed config with every plugin's parameters (defaults included) written
    back, so ``loongsage config show`` prints all of them; the other fields are what the
    run is built from. Nothing downstream looks a plugin name up again. ``recipe`` and
    ``overrides`` say what the config was composed from (the exported model card names them).
    """

    cfg: DictConfig
    registries: Registries
    algorithm: AlgorithmSpec
    sources: tuple[SourceSpec, ...]
    window_policy: PluginRef
    trackers: tuple[PluginRef, ...]
    middlewares: tuple[PluginRef, ...]
    tool_parser: PluginRef
    router: RouterPlugins  # what the router is handed: the middlewares, its (overridable) tool parser
    train_engine: PluginRef
    rollout_engine: PluginRef
    step_terms: tuple[ActiveTerm, ...] = ()  # the step terms extending the training step (config.step_terms)
    recipe: str = ""
    overrides: tuple[str, ...] = ()


def _reward(node: DictConfig, key: str, cfg: DictConfig, registries: Registries) -> PluginRef:
    """The source's reward with its generic keys (defaults: the ``reward`` section) checked."""
    section = cfg.reward
    defaults = RewardOptions(timeout_s=section.timeout_s, on_error=section.on_error)
    ref = registries.resolve("reward", node, key, options=defaults)
    for field in dataclasses.fields(RewardOptions):  # checked like the run-wide keys they default from
        _check_value(f"{key}.{field.name}", f"reward.{field.name}", getattr(ref.options, field.name))
    return ref


TRIPLE = ("dataset", "agent", "reward")


def _triple(i: int, node: DictConfig, cfg: DictConfig, registries: Registries) -> dict[str, Any]:
    """The source's dataset, agent and reward: its own, or bound to the environment it names."""
    key = f"data_sources[{i}]"
    if node.environment is None:
        for name in ("dataset", "reward"):
            if node[name] is None:
                raise ConfigError(f"{key}.{name}", "required value missing: a source names a dataset, "
                                  "an agent (default single_turn) and a reward, or an environment instead")
        agent = node.agent if node.agent is not None else "single_turn"
        return {"dataset": registries.resolve("dataset", node.dataset, source=i),
                "agent": registries.resolve("agent", agent, source=i),
                "reward": _reward(node.reward, KINDS["reward"].key(i), cfg, registries), "environment": None}
    given = [name for name in TRIPLE if node[name] is not None]
    if given:
        raise ConfigError(f"{key}.{given[0]}", f"the source names both an environment ({key}.environment) "
                          f"and {', '.join(f'{key}.{g}' for g in given)}: an environment supplies its own tasks, "
                          "episodes and rewards; name either the environment or the dataset/agent/reward triple")
    env = registries.resolve("environment", node.environment, options=EnvironmentOptions(), source=i)
    check_environment_library(env)
    reward_options = RewardOptions(timeout_s=cfg.reward.timeout_s, on_error=cfg.reward.on_error)
    dataset, agent, reward = bind_environment(env, registries, bool(node.eval_only), reward_options)
    return {"dataset": dataset, "agent": agent, "reward": reward, "environment": env}


def _source_spec(i: int, node: DictConfig, cfg: DictConfig, registries: Registries) -> SourceSpec:
    sandbox = node.sandbox
    return SourceSpec(
        index=i,
        name=str(node.name),
        weight=float(node.weight),
        **_triple(i, node, cfg, registries),
        sandbox=registries.resolve("sandbox", sandbox, source=i) if sandbox is not None else None,
        filters=registries.resolve_all("data_filter", node.filters, source=i),
        sampling=as_container(node.sampling),
        system_prompt=node.system_prompt,
        eval_only=bool(node.eval_only),
        load_budget=Budget(cfg.budgets.dataset_load_s, "budgets.dataset_load_s"),
        get_budget=Budget(cfg.budgets.dataset_get_s, "budgets.dataset_get_s"),
    )


def _write_back(cfg: DictConfig, run: RunConfig) -> None:
    """Spell every resolved plugin's parameters out in ``cfg`` (for ``config show`` and run dirs)."""
    alg, spec = cfg.algorithm, run.algorithm
    alg.advantage_estimator = spec.advantage.as_node()
    alg.policy_loss = spec.policy_loss.as_node()
    if isinstance(alg.is_correction, ListConfig):
        alg.is_correction = [c.as_node() for c in spec.corrections]
    elif alg.is_correction is not None:
        alg.is_correction = spec.corrections[0].as_node()
    alg.filters = [f.as_node() for f in spec.filters]
    cfg["async"].window_policy = run.window_policy.as_node()
    cfg.agentflow.middlewares = [m.as_node() for m in run.middlewares]
    cfg.logging.trackers = [t.as_node() for t in run.trackers]
    for node, source in zip(cfg.data_sources, run.sources):
        if source.environment is not None:
            node.environment = source.environment.as_node()
        else:
            node.dataset = source.dataset.as_node()
            node.agent = source.agent.as_node()
            node.reward = source.reward.as_node()
        if source.sandbox is not None:
            node.sandbox = source.sandbox.as_node()
        node.filters = [f.as_node() for f in source.filters]


def _resolve_plugins(cfg: DictConfig, registries: Registries) -> RunConfig:
    resolve = registries.resolve
    run = RunConfig(
        cfg=cfg,
        registries=registries,
        algorithm=validate_algorithm(cfg.algorithm, registries),
        sources=tuple(_source_spec(i, node, cfg, registries) for i, node in enumerate(cfg.data_sources)),
        window_policy=resolve("window_policy", cfg["async"].window_policy),
        trackers=registries.resolve_all("tracker", cfg.logging.trackers),
        middlewares=(middlewares := registries.resolve_all("router_middleware", cfg.agentflow.middlewares)),
        tool_parser=(tool_parser := resolve("tool_parser", cfg.agentflow.tool_parser)),
        router=router_plugins(registries, tool_parser, middlewares),  # the middleware's parser override
        train_engine=resolve("engine", cfg.train.backend, "train.backend"),  # two fields: no one key
        rollout_engine=resolve("engine", cfg.rollout.backend, "rollout.backend"),
        step_terms=validate_step_terms(cfg, registries),
    )
    if cfg.train.lora.rank > 0 and not getattr(run.train_engine.obj, "supports_lora", False):
        raise ConfigError("train.lora.rank", f"train.backend {cfg.train.backend!r} has no LoRA support; "
                          "LoRA runs on embedded_train (or set train.lora.rank=0)")
    check_backend_keys(cfg, run.train_engine.obj)
    check_optional_packages(cfg)
    _write_back(cfg, run)
    return run


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
    if all(source.eval_only for source in cfg.data_sources):
        raise ConfigError(f"data_sources[{len(cfg.data_sources) - 1}].eval_only",
                          "every data source is eval_only; at least one must be trained on")


def _check_agents(cfg: DictConfig, sources: tuple[SourceSpec, ...]) -> None:
    """Partial rollout needs agents that can continue a sample aborted at a weight update: a
    white-box agent's ``continue_sample``, or a router-based agent whose router continues the
    aborted turn itself (``continues_turns_in_place``)."""
    if not cfg.rollout.partial:
        return
    for source in sources:
        agent = source.agent.obj
        if not hasattr(agent, "continue_sample") and not getattr(agent, "continues_turns_in_place", False):
            raise ConfigError(
                f"{source.key}.agent",
                f"agent {source.agent.name!r} cannot continue a sample aborted at a weight update: "
                "it has neither continue_sample (white-box agents) nor continues_turns_in_place "
                "(agents whose turns go through the AgentFlow router), which rollout.partial=true "
                "needs; set rollout.partial=false (in-flight samples then finish under the new "
                "weights instead)",
            )


def _check_baseline(cfg: DictConfig, algorithm: AlgorithmSpec) -> None:
    """One sample per prompt leaves a group-relative estimator nothing to compare with."""
    estimator = algorithm.advantage
    if cfg.rollout.n_samples_per_prompt == 1 and getattr(estimator.params, "group_baseline", False):
        raise ConfigError(
            "rollout.n_samples_per_prompt",
            f"advantage estimator '{estimator.name}' baselines each sample by the other samples of "
            "its prompt group; with 1 sample per prompt every group holds one sample and every "
            "advantage is 0. Sample >= 2 per prompt, or baseline each token by a learned value "
            "model's values (algorithm/advantage_estimator=gae)",
        )


def _check_values_supplied(run: RunConfig) -> None:
    """An estimator reading per-token values (``needs_values``) needs a step term supplying them."""
    estimator = run.algorithm.advantage
    if estimator.flag("needs_values") and not any("values" in term.supplies for term in run.step_terms):
        raise ConfigError(
            "algorithm.advantage_estimator",
            f"advantage estimator '{estimator.name}' reads per-token values [N, L] as its baseline, and no "
            "active step term supplies them (loongsage-algos' value model does: pip install "
            "loongsage-algos)",
        )


def validate_config(cfg: DictConfig, registries: Registries) -> RunConfig:
    """Return the typed config with its plugins resolved, or raise ``ConfigError``/``UnknownPluginError``."""
    cfg = _typed(cfg, registries)
    missing = _missing_keys(cfg)
    for i, source in enumerate(cfg.data_sources):
        missing += _missing_keys(source, f"data_sources[{i}].")
    if missing:
        raise ConfigError(missing[0], f"required value missing (all missing: {', '.join(missing)})")
    _check_fields(cfg)
    _check_modes(cfg)
    _check_shapes(cfg)
    _check_data_sources(cfg)
    run = _resolve_plugins(cfg, registries)
    _check_agents(cfg, run.sources)
    _check_baseline(cfg, run.algorithm)
    _check_values_supplied(run)
    return run


def as_container(cfg: DictConfig | ListConfig) -> Any:
    """Plain Python containers of a config (for pickling into actors and writing to disk)."""
    return OmegaConf.to_container(cfg, resolve=True)
