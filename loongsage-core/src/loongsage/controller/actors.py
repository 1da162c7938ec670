"""Ray plumbing: start or attach to a cluster, host engines as actors.

Every heavy component is an ``EngineHost`` actor wrapping one engine object built by its
registered class (``from_config(cfg)``). The controller calls engine methods through
``call`` and ships small functions that compose several engine calls inside the actor
through ``run`` (so tensors stay in the actor's process).

Disaggregated placement on a local cluster pins each actor to its own cores
(``split_cores``): Ray's ``num_cpus`` only books CPUs, it does not keep the trainer's and
the engine's threads off each other's cores, and an overlapped run whose phases fight for
the same cores measures contention, not overlap (REFERENCE §2.2b).
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Sequence

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


def split_cores(
    available: Sequence[int], train_cpus: float, rollout_cpus: float, engines: int
) -> tuple[list[int], list[list[int]]]:
    """Disjoint core sets: the trainer's, then one per rollout engine (``ceil`` of each share).

    When the machine has fewer cores than asked for, the sets wrap around and overlap
    (Ray booked the CPUs, so this only happens with ``placement.num_cpus`` above the real count).
    """
    cores = sorted(available)
    if not cores:
        raise ValueError("split_cores: no CPU cores available")
    need = [max(1, math.ceil(train_cpus))] + [max(1, math.ceil(rollout_cpus))] * engines
    sets, start = [], 0
    for count in need:
        sets.append([cores[(start + i) % len(cores)] for i in range(count)])
        start += count
    return sets[0], sets[1:]


def pin_process(cpus: Sequence[int]) -> None:
    """Restrict every thread of this process (and the threads they start) to ``cpus``."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # the thread exited meanwhile
            continue


class EngineHost:
    """A Ray actor body holding one engine; ``cpus`` pins it to those cores (Linux)."""

    def __init__(self, engine_cls: Any, cfg: dict, num_threads: int, cpus: Sequence[int] | None = None) -> None:
        import torch
        import transformers
        from omegaconf import OmegaConf

        if cpus:
            pin_process(cpus)
        transformers.utils.logging.disable_progress_bar()
        torch.set_num_threads(num_threads or (len(cpus) if cpus else os.cpu_count()) or 1)
        self.engine = engine_cls.from_config(OmegaConf.create(cfg))

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.engine, method)(*args, **kwargs)

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(self.engine, *args, **kwargs)


def spawn_engine(
    engine_cls: Any, cfg: dict, num_cpus: float, num_threads: int, name: str, cpus: Sequence[int] | None = None
) -> Any:
    """Start an ``EngineHost`` actor; in colocated mode several hosts share the same CPUs.

    ``cpus``: cores to pin the actor to (disaggregated placement on a local cluster), or None.
    """
    actor = ray.remote(EngineHost).options(num_cpus=num_cpus, name=None, max_concurrency=4)
    return actor.remote(engine_cls, cfg, num_threads, list(cpus) if cpus else None)
