"""Helpers for the environment tests: a reasoning-gym source node and validated, built sources
from bare ``data_sources`` nodes (no model, no Ray)."""

from __future__ import annotations

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
