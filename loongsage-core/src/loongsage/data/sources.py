"""Data sources: build each ``data_sources[i]`` entry's dataset, reward and agent by name.

A ``DataSource`` bundles what one entry of the config names: the dataset (built as
``cls(params, seed)``), the reward (``reward(text, ground_truth, params, **context)``),
the agent (built as ``cls(params, tokenizer)``), an optional sandbox and teacher, filters,
and per-source sampling overrides. Every name is looked up in the registries with the
config key in the error (``data_sources[1].reward.name``), and every parameter mapping is
validated against the plugin's parameter dataclass.

``DataSource.get(index)`` is what the mixer reads: the dataset's prompt, stamped with the
source's name and index, with the source's ``system_prompt`` (when set) as the first
message, replacing a system message the dataset supplied.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from omegaconf import DictConfig, OmegaConf

from loongsage.data.types import Prompt
from loongsage.errors import ConfigError
from loongsage.registry import Registries, RegistryEntry


@dataclass
class PluginRef:
    """A resolved reference: the registry entry and its validated parameters."""

    entry: RegistryEntry
    params: Any

    @property
    def name(self) -> str:
        return self.entry.name


@dataclass
class DataSource:
    """One data source, built: prompts, scoring, agent loop and sampling overrides."""

    name: str
    weight: float
    dataset: Any  # has get(index) -> Prompt, and __len__ unless infinite
    reward: Callable[..., Any]
    reward_params: Any
    agent: Any = None  # built agent; None when built without a tokenizer
    agent_ref: PluginRef | None = None
    sandbox: PluginRef | None = None
    teacher: str | None = None
    filters: list[PluginRef] = field(default_factory=list)
    sampling: dict[str, Any] = field(default_factory=dict)
    system_prompt: str | None = None

    def size(self) -> int | None:
        """Number of prompts in one epoch, or ``None`` for an infinite dataset."""
        return len(self.dataset) if hasattr(self.dataset, "__len__") else None

    def get(self, index: int) -> Prompt:
        """Prompt ``index`` of the dataset, stamped with this source."""
        prompt = self.dataset.get(index)
        messages = list(prompt.messages)
        if self.system_prompt:
            if messages and messages[0].get("role") == "system":
                messages = messages[1:]
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        return dataclasses.replace(prompt, source=self.name, index=index, messages=messages)

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools this source's agent offers the model (``[]`` for agents without tools)."""
        offered = getattr(self.agent, "tool_schemas", None)
        return list(offered()) if offered is not None else []

    def tool_parser(self) -> str:
        """The tool parser this source's agent reads tool calls with (``hermes`` by default)."""
        settings = getattr(self.agent, "router_settings", None)
        return settings().tool_parser if settings is not None else "hermes"

    def score(self, text: str, ground_truth: Any, **context: Any) -> dict[str, Any]:
        """The reward as a dict with a float ``score`` (a bare float becomes ``{"score": x}``)."""
        result = self.reward(text, ground_truth, self.reward_params, **context)
        if isinstance(result, Mapping):
            if "score" not in result:
                raise ValueError(f"reward of source {self.name!r} returned a dict without 'score': {result!r}")
            return {**result, "score": float(result["score"])}
        return {"score": float(result)}

    @property
    def runtime(self) -> Any:
        """What the rollout manager needs (``loongsage.controller.rollout.SourceRuntime``)."""
        if self.agent is None:
            raise RuntimeError(f"data source {self.name!r} was built without a tokenizer, so it has no agent")
        from loongsage.controller.rollout import SourceRuntime

        return SourceRuntime(self.name, self.agent, self.reward, self.reward_params, dict(self.sampling))


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def resolve_ref(
    node: Any, kind: str, key: str, registries: Registries, name_field: str = "name"
) -> PluginRef:
    """Look up ``node`` (a bare name or ``{name_field: NAME, **params}``) in the ``kind`` registry."""
    node = _plain(node)
    if isinstance(node, str):
        node = {name_field: node}
    if not isinstance(node, Mapping) or name_field not in node:
        raise ConfigError(key, f"expected a {kind} name or a mapping with '{name_field}', got {node!r}")
    values = dict(node)
    name = values.pop(name_field)
    entry = registries[kind].entry(name, f"{key}.{name_field}")
    return PluginRef(entry, entry.build_params(values, key))


def build_source(
    spec: Any, index: int, registries: Registries, seed: int = 0, tokenizer: Any = None
) -> DataSource:
    """Build ``data_sources[index]`` from its config mapping."""
    key = f"data_sources[{index}]"
    spec = _plain(spec)
    if not isinstance(spec, Mapping):
        raise ConfigError(key, f"expected a mapping, got {spec!r}")
    for required in ("name", "dataset", "reward"):
        if spec.get(required) in (None, "???"):
            raise ConfigError(f"{key}.{required}", "required value missing")
    dataset_ref = resolve_ref(spec["dataset"], "dataset", f"{key}.dataset", registries, "format")
    reward_ref = resolve_ref(spec["reward"], "reward", f"{key}.reward", registries)
    agent_ref = resolve_ref(spec.get("agent") or "single_turn", "agent", f"{key}.agent", registries)
    sandbox = spec.get("sandbox")
    sandbox_ref = resolve_ref(sandbox, "sandbox", f"{key}.sandbox", registries, "type") if sandbox else None
    filters = [
        resolve_ref(f, "data_filter", f"{key}.filters[{j}]", registries)
        for j, f in enumerate(spec.get("filters") or [])
    ]
    try:
        dataset = dataset_ref.entry.obj(dataset_ref.params, seed)
    except ConfigError as err:  # the dataset names its own field; prefix the source's key
        raise ConfigError(f"{key}.{err.key}", err.problem) from None
    except (OSError, ValueError) as err:  # missing file, bad record: the message names them
        raise ConfigError(f"{key}.dataset", str(err)) from err
    agent = agent_ref.entry.obj(agent_ref.params, tokenizer) if tokenizer is not None else None
    return DataSource(
        name=str(spec["name"]),
        weight=spec.get("weight", 1.0),
        dataset=dataset,
        reward=reward_ref.entry.obj,
        reward_params=reward_ref.params,
        agent=agent,
        agent_ref=agent_ref,
        sandbox=sandbox_ref,
        teacher=spec.get("teacher"),
        filters=filters,
        sampling=dict(spec.get("sampling") or {}),
        system_prompt=spec.get("system_prompt"),
    )


def build_sources(cfg: Any, registries: Registries, tokenizer: Any = None) -> dict[str, DataSource]:
    """Build every ``cfg.data_sources`` entry, keyed by source name, in config order."""
    specs = cfg["data_sources"] if "data_sources" in cfg else None
    if not specs:
        raise ConfigError("data_sources", "at least one data source is required")
    seed = int(cfg["trainer"]["seed"]) if "trainer" in cfg else 0
    sources: dict[str, DataSource] = {}
    for i, spec in enumerate(specs):
        source = build_source(spec, i, registries, seed, tokenizer)
        if source.name in sources:
            raise ConfigError(f"data_sources[{i}].name", f"duplicate data source name {source.name!r}")
        sources[source.name] = source
    return sources
