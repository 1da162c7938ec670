"""Helpers for the environment tests: a reasoning-gym source node, validated, built sources
from bare ``data_sources`` nodes (no model, no Ray), and adder-tools' own scoring of a reply."""

from __future__ import annotations

import asyncio

from omegaconf import OmegaConf

from loongsage.config.validate import validate_config
from loongsage.data.sources import build_sources

GYM = {"type": "reasoning_gym", "tasks": ["basic_arithmetic", {"name": "leg_counting", "weight": 3}],
       "size": 40, "held_out_size": 8}


def config(*sources):
    return OmegaConf.create({"model": {"path": "unused"}, "data_sources": list(sources)})


def built(registries, *sources, tokenizer=None):
    """The validated run config of ``sources`` and its built data sources."""
    run = validate_config(config(*sources), registries)
    return run, build_sources(run.sources, registries, 0, tokenizer)


def library_reward(task_data: dict, final_reply: str) -> float:
    """adder-tools' own scoring (``Task.score``: its rewards, weighted) of a final reply."""
    import verifiers.v1 as vf
    from adder_tools.taskset import AdderData, AdderTask

    task = AdderTask(AdderData.model_validate(task_data))
    trace = vf.Trace(task=vf.TraceTask(type="AdderTask", data=task.data),
                     agent=vf.AgentInfo(config=vf.AgentConfig()), root_reply=final_reply)
    asyncio.run(task.score(trace))
    return trace.reward


def flaky_plugin(name: str, environment: str, params: str, message: str) -> str:
    """Source of a plugin module registering ``name``: the environment class ``environment``
    ("module:Class" in ``loongsage_agents.environments``) whose every second episode raises
    ``RuntimeError(message)`` once the library ran it, with the parameters class ``params``."""
    env_module, env_class = f"loongsage_agents.environments.{environment}".split(":")
    params_module, params_class = f"loongsage_agents.environments.{params}".split(":")
    return (f"from loongsage.plugin import hookimpl\n"
            f"from {env_module} import {env_class}\n"
            f"from {params_module} import {params_class}\n\n\n"
            f"class Flaky({env_class}):\n"
            f"    calls = 0\n\n"
            f"    async def run_episode(self, task, endpoint):\n"
            f"        episode = await super().run_episode(task, endpoint)\n"
            f"        Flaky.calls += 1\n"
            f"        if Flaky.calls % 2 == 0:\n"
            f"            raise RuntimeError({message!r})\n"
            f"        return episode\n\n\n"
            f"@hookimpl\n"
            f"def loongsage_register_environments(register):\n"
            f"    register({name!r}, Flaky, params={params_class})\n")
