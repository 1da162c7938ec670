"""Environments: a data source that names one supplies its tasks, its episodes and their rewards.

A source names either an environment (``data_sources[i].environment``, ``type:`` the
``environment`` plugin, the rest its typed parameters) or the dataset/agent/reward triple. An
environment is an episode library's bundle (reasoning-gym's procedural tasks, a verifiers
taskset, an OpenEnv server, or a plugin): it is built once per source with its parameters and
an ``EnvironmentContext``, and answers two calls::

    env.tasks(split)                         # split: "train" | "held_out"; get(i) -> Prompt, len()
    await env.run_episode(task, endpoint)    # -> Episode(reward, metrics, text, info)

``run_episode`` makes its model calls against ``endpoint`` (the trajectory's AgentFlow router
URLs, key, model name and sampling fields), so every call is recorded token-exactly as any
agent's are; it returns the episode's own reward and metrics. An episode runs as one trajectory
of the ``environment`` agent (registered by loongsage-agents, which owns the router-based
trajectory logic: seeds, failure marking, deadlines), and its reward reaches training through
``episode_reward``, the source's reward, so an environment source is scored, counted and saved
like any other: a failed or timed-out episode is a failed trajectory (``rollout.failed_trajectory``
decides), a missing or non-finite reward a reward error (``reward.on_error`` decides).

``bind_environment`` is what config validation calls: it turns a resolved environment
reference into the source's dataset, agent and reward references. The environment node's
generic keys (``EnvironmentOptions``) set the episode agent's deadline and concurrency. A
parameter dataclass may declare ``requires = (module, distribution, extra)``: the library the
environment drives, checked (found, not imported) before any actor starts, with the command
that installs the extra (``loongsage.config.backend_support.check_environment_library``).

This module is cheap to import (the reward worker processes preload it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from loongsage.errors import ConfigError, UnknownPluginError
from loongsage.registry import PluginRef, Registries, RegistryEntry

EPISODE_AGENT = "environment"  # the agent of loongsage-agents that runs episodes
SPLITS = ("train", "held_out")


@dataclass
class EnvironmentOptions:
    """The generic keys of every ``data_sources[i].environment`` node, beside the environment's
    own parameters."""

    episode_timeout_s: float = 300.0  # an episode running longer is stopped and marked failed
    concurrency: int = 0  # episodes of one prompt group run at once; 0 = all of them


@dataclass(frozen=True)
class EnvironmentContext:
    """What a data source lends the environment it builds."""

    source: str
    key: str  # "data_sources[i].environment", for errors
    seed: int  # trainer.seed
    sandbox: Any = None  # the source's SandboxFactory, where the environment runs code


@dataclass(frozen=True)
class Endpoint:
    """Where one episode calls the policy: its trajectory's router URLs and key.

    ``urls`` maps a wire format to its base URL (``openai``: ``.../v1``, ``anthropic``);
    ``sampling`` holds the rollout's sampling as Chat Completions fields (``max_tokens``,
    ``temperature``, ``top_p``), which the router enforces on every trained turn anyway.
    """

    urls: Mapping[str, str]
    api_key: str
    model: str
    sampling: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Episode:
    """What one episode returns: its reward, its metrics (logged per source), its final text."""

    reward: float
    metrics: dict[str, float] = field(default_factory=dict)
    text: str = ""  # the final answer, for logs and saved samples
    info: dict[str, Any] = field(default_factory=dict)  # joins the sample's reward_info


@dataclass(frozen=True)
class EnvironmentBinding:
    """The parameters of an environment source's dataset reference: which environment, which split."""

    environment: PluginRef
    split: str


def split_of(eval_only: bool) -> str:
    """The split a source reads: held-out tasks for an ``eval_only`` source, else training tasks."""
    return "held_out" if eval_only else "train"


def episode_reward(text: str, ground_truth: Any, params: Any, *, sample: Any = None,
                   **context: Any) -> dict[str, Any]:
    """The reward of an environment source: the episode's own reward, as ``run_episode`` returned it.

    A failed episode (``reward_info["failed"]``) scores 0 without an error of its own (it is
    counted as a failed trajectory); an episode that finished without a reward is a reward error.
    """
    info = sample.reward_info if sample is not None else {}
    if info.get("failed"):
        return {"score": 0.0}
    if "episode_reward" not in info:
        raise ValueError("the episode finished without a reward")
    return {"score": info["episode_reward"]}


def _entry(kind: str, env: PluginRef, target: Any) -> RegistryEntry:
    return RegistryEntry(kind, env.name, target, env.entry.distribution, None,
                         f"the tasks, episodes and rewards of environment '{env.name}'")


def bind_environment(env: PluginRef, registries: Registries, eval_only: bool,
                     reward_options: Any) -> tuple[PluginRef, PluginRef, PluginRef]:
    """The dataset, agent and reward references of a source that names environment ``env``."""
    options = env.options or EnvironmentOptions()
    if options.episode_timeout_s <= 0 or options.concurrency < 0:
        raise ConfigError(env.key, "expected episode_timeout_s > 0 and concurrency >= 0, got "
                          f"{options.episode_timeout_s} and {options.concurrency}")
    try:
        agent = registries.resolve("agent", {"name": EPISODE_AGENT, "concurrency": options.concurrency,
                                             "episode_timeout_s": options.episode_timeout_s}, env.key)
    except UnknownPluginError:
        from loongsage.catalogue import install_hint

        raise ConfigError(env.key, f"environment sources run their episodes with the {EPISODE_AGENT!r} "
                          f"agent, which no loaded distribution registers:"
                          f"{install_hint('agent', EPISODE_AGENT)}") from None
    dataset = PluginRef(_entry("dataset", env, env.entry.target),  # built by build_source's environment branch
                        EnvironmentBinding(env, split_of(eval_only)), env.key)
    reward = PluginRef(_entry("reward", env, "loongsage.data.environments:episode_reward"),
                       None, env.key, reward_options)
    return dataset, agent, reward


def build_environment(env: PluginRef, context: EnvironmentContext) -> Any:
    """The environment object of a source (built once per source and process)."""
    return env.obj(env.params, context)


def environment_tasks(environment: Any, split: str) -> Any:
    """The environment's tasks of ``split``, checked to be a dataset (``get``, ``len``)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    tasks = environment.tasks(split)
    if not callable(getattr(tasks, "get", None)):
        raise ValueError(f"{type(environment).__name__}.tasks({split!r}) returned a "
                        f"{type(tasks).__name__}, not a dataset with get(index)")
    return tasks
