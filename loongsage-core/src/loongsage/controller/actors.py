"""Ray plumbing: start or attach to a cluster, host engines as actors.

Every heavy component is an ``EngineHost`` actor wrapping one engine object built by its
registered class (``from_config(cfg)``). The controller calls engine methods through
``call`` and ships small functions that compose several engine calls inside the actor
through ``run`` (so tensors stay in the actor's process).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import ray


# OpenMP threads that spin while waiting starve colocated actors sharing the same cores
# (measured: 15 tiny SFT steps took 49 s spinning vs 2.4 s passive on 2 busy cores).
ACTOR_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


def start_ray(placement: Any) -> None:
    """Attach to ``placement.ray_address`` / ``RAY_ADDRESS``, else start a local cluster."""
    if ray.is_initialized():
        return
    address = placement.ray_address or os.environ.get("RAY_ADDRESS")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    runtime_env = {"env_vars": {k: os.environ.get(k, v) for k, v in ACTOR_ENV.items()}}
    if address:
        ray.init(address=address, ignore_reinit_error=True, runtime_env=runtime_env)
        return
    ray.init(
        num_cpus=placement.num_cpus or os.cpu_count(),
        include_dashboard=False,
        object_store_memory=placement.object_store_memory,
        ignore_reinit_error=True,
        log_to_driver=True,
        runtime_env=runtime_env,
    )


class EngineHost:
    """A Ray actor body holding one engine."""

    def __init__(self, engine_cls: Any, cfg: dict, num_threads: int) -> None:
        import torch
        import transformers
        from omegaconf import OmegaConf

        transformers.utils.logging.disable_progress_bar()
        torch.set_num_threads(num_threads or os.cpu_count() or 1)
        self.engine = engine_cls.from_config(OmegaConf.create(cfg))

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.engine, method)(*args, **kwargs)

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(self.engine, *args, **kwargs)


def spawn_engine(engine_cls: Any, cfg: dict, num_cpus: float, num_threads: int, name: str) -> Any:
    """Start an ``EngineHost`` actor; in colocated mode several hosts share the same CPUs."""
    actor = ray.remote(EngineHost).options(num_cpus=num_cpus, name=None, max_concurrency=4)
    return actor.remote(engine_cls, cfg, num_threads)
