"""The ``verifiers`` environment: an installed verifiers v1 environment's tasks and episodes.

A verifiers environment (github.com/PrimeIntellect-ai/verifiers, ``verifiers.v1``) is a module
exporting one ``vf.Taskset``: ``load()`` yields its tasks; rewards and metrics are the task's
``@vf.reward``/``@vf.metric`` methods; tools are MCP servers (``vf.Toolset``) started per
rollout; a harness (the agent program, ``null`` = a plain chat loop over the MCP tools) runs in
a runtime (``subprocess`` = a local process). ``id`` names the module, ``args`` its taskset
config, exactly as ``vf-eval ID --env.taskset.*`` take them.

Tasks: the taskset's ``load()`` read once, shuffled with ``seed``; the first ``held_out_size``
are the held-out split (an ``eval_only`` source reads them), the rest (at most ``size``) the
training split, so the two never share a task. A prompt carries the task's wire data.

Episodes run in verifiers' own env server (``verifiers_server``, the path prime-rl takes):
each sample is one ``EnvClient.run`` whose client config points at that trajectory's router
URL, so every model call the harness makes is recorded token-exactly as one trajectory (the
URL names it). Its reward is the episode's first trace's reward (its weighted rewards'
sum), its metrics the trace's metrics plus each reward's score (``reward_<name>``) and its
turns. An episode verifiers reports as failed (``ok`` false: a harness or tool error, a
scorer that raised, a deadline) raises, so the episode agent marks and counts it.
"""

from __future__ import annotations

import random
from typing import Any

from loongsage.plugin import ConfigError, Endpoint, EnvironmentContext, Episode, Prompt

from loongsage_agents.environments.verifiers_params import VerifiersParams
from loongsage_agents.environments.verifiers_server import EnvServerProcess, shared_server

API_KEY_VAR = "LOONGSAGE_VERIFIERS_API_KEY"  # unset: the router URL's path names the trajectory


def _key_of(locations: set[tuple[Any, ...]]) -> str:
    """The parameter a refused verifiers config field comes from (``agent.runtime`` -> ``runtime``)."""
    keys = {"args" if loc[:1] == ("taskset",) else str(loc[1]) if loc[1:2] in (("harness",), ("runtime",))
            else "agent" for loc in locations}
    return keys.pop() if len(keys) == 1 else "args"


def env_config(params: VerifiersParams) -> Any:
    """verifiers' run config of these parameters (``vf-eval``'s ``--env.*``), validated by verifiers."""
    from pydantic import ValidationError
    from verifiers.v1.utils.loaders import resolve_env_config

    agent = {**params.agent, "harness": {"id": params.harness}, "runtime": {"type": params.runtime}}
    data = {"taskset": {**params.args, "id": params.id}, "agent": agent}
    try:
        return resolve_env_config(data)
    except ValidationError as err:
        key = _key_of({tuple(e["loc"]) for e in err.errors()})
        raise ConfigError(key, f"verifiers refused the config of environment {params.id!r}: {err}") from None
    except (ModuleNotFoundError, TypeError, AttributeError, ValueError) as err:
        key = "harness" if str(err).startswith("harness ") else "id"
        raise ConfigError(key, f"verifiers could not load environment {params.id!r}: {err}") from None


class TaskList:
    """One split's tasks: ``get(index) -> Prompt`` whose metadata holds the task's wire data."""

    def __init__(self, split: str, tasks: list[Any]) -> None:
        self.split = split
        self.tasks = tasks

    def __len__(self) -> int:
        return len(self.tasks)

    def get(self, index: int) -> Prompt:
        data = self.tasks[index].data
        prompt = data.prompt if data.prompt is not None else ""
        messages = ([{"role": "user", "content": prompt}] if isinstance(prompt, str)
                    else [m.model_dump(mode="json", exclude_none=True) for m in prompt])
        if data.system_prompt:
            messages.insert(0, {"role": "system", "content": data.system_prompt})
        return Prompt(source="", index=index, messages=messages,
                      metadata={"task_data": data.model_dump(mode="json"), "task_idx": data.idx,
                                "split": self.split})


class VerifiersEnvironment:
    """A verifiers v1 environment's tasks, each episode run by verifiers' env server."""

    def __init__(self, params: VerifiersParams, context: EnvironmentContext) -> None:
        from verifiers.v1.utils.loaders import load_taskset

        self.params = params
        self.context = context
        self.config = env_config(params)
        taskset = load_taskset(self.config.taskset)
        if not taskset.bounded:  # an endless taskset: read what the splits need
            if params.size is None:
                raise ConfigError("size", f"verifiers environment {params.id!r} has endless tasks; set size")
            taskset = taskset.take(params.size + params.held_out_size)
        tasks = list(taskset)
        order = list(range(len(tasks)))
        random.Random(f"verifiers:{params.id}:{params.seed}").shuffle(order)
        held = [tasks[i] for i in order[:params.held_out_size]]
        train = [tasks[i] for i in order[params.held_out_size:]][:params.size]
        if not train:
            raise ConfigError("held_out_size", f"verifiers environment {params.id!r} has {len(tasks)} tasks; "
                              f"held_out_size {params.held_out_size} leaves none to train on")
        self.splits = {"train": train, "held_out": held}

    def tasks(self, split: str) -> TaskList:
        if split == "held_out" and not self.splits["held_out"]:
            raise ConfigError("held_out_size", "an eval_only source reads the held-out tasks; set held_out_size > 0")
        return TaskList(split, self.splits[split])

    async def server(self) -> EnvServerProcess:
        """The env server of this config (shared by the sources that have the same one), healthy."""
        server = shared_server(self.config.model_dump(mode="json"), self.params.id)
        await server.wait_healthy(self.params.server_start_timeout_s)
        return server

    async def run_episode(self, task: Prompt, endpoint: Endpoint) -> Episode:
        from verifiers.v1.clients import EvalClientConfig
        from verifiers.v1.serve import EnvClient
        from verifiers.v1.types import SamplingConfig

        server = await self.server()
        client = EnvClient(server.address)
        try:
            episode = await client.run(EvalClientConfig(base_url=endpoint.urls["openai"], api_key_var=API_KEY_VAR),
                                       endpoint.model, SamplingConfig(**dict(endpoint.sampling)),
                                       task.metadata["task_data"])
        finally:
            await client.close()
        if not episode.ok or not episode.traces:
            errors = [*episode.errors, *(e for trace in episode.traces for e in trace.errors)]
            why = "; ".join(f"{e.type}: {e.message}" for e in errors) or "no trace"
            raise RuntimeError(f"the verifiers episode failed: {why}")
        trace = episode.traces[0]
        metrics = {name: float(value) for name, value in trace.metrics.items() if value is not None}
        metrics |= {f"reward_{name}": r.score for name, r in trace.rewards.items() if r is not None}
        metrics["turns"] = float(trace.num_turns)
        return Episode(reward=float(trace.reward), metrics=metrics, text=trace.last_reply,
                       info={"stop_condition": trace.stop_condition or ""})
