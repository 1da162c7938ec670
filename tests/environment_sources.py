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
