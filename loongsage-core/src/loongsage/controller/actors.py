"""Ray plumbing: start or attach to a cluster, host engines as actors.

Every heavy component is an ``EngineHost`` actor wrapping one engine object built by its
registered class (``from_config(cfg)``). The controller calls engine methods through
``call`` and ships small functions that compose several engine calls inside the actor
through ``run`` (so tensors stay in the actor's process).

Every engine call runs on one dedicated compute thread of its host. Ray gives an actor with
``max_concurrency`` > 1 a thread pool and hands successive calls to successive threads, and
glibc gives each thread its own malloc arena: a train step on a new thread could not reuse
the memory the previous step freed in another arena, so the train actor kept about one
step's worth of activations per pool thread (measured on SmolLM2: 4.2 GB after 9 steps on
one thread, 10.6 GB with calls rotating over 4 threads). The pool's other threads stay free
for ``memory``, which must answer while a step runs.

Disaggregated placement on a local cluster pins each actor to its own cores
(``split_cores``): Ray's ``num_cpus`` only books CPUs, it does not keep the trainer's and
the engine's threads off each other's cores, and an overlapped run whose phases fight for
the same cores measures contention, not overlap (REFERENCE §2.2b).
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import ray

from loongsage.controller.memory import PeakSampler, release_free_memory, rss_bytes


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
    """A Ray actor body holding one engine; ``cpus`` pins it to those cores (Linux).

    The engine is built, called and run on the host's single compute thread (see the module
    docstring); ``memory`` reports the process's RSS from whichever Ray thread it lands on.
    """

    def __init__(self, engine_cls: Any, cfg: dict, num_threads: int, cpus: Sequence[int] | None = None) -> None:
        import transformers
        from omegaconf import OmegaConf

        if cpus:
            pin_process(cpus)
        self._memory = PeakSampler(rss_bytes, interval_s=0.05)
        self._compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loongsage-engine")
        transformers.utils.logging.disable_progress_bar()
        threads = num_threads or (len(cpus) if cpus else os.cpu_count()) or 1
        self.engine = self._on_compute(self._build, engine_cls, OmegaConf.create(cfg), threads)

    @staticmethod
    def _build(engine_cls: Any, cfg: Any, threads: int) -> Any:
        import torch

        torch.set_num_threads(threads)
        return engine_cls.from_config(cfg)

    def _on_compute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._compute.submit(fn, *args, **kwargs).result()

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._on_compute(getattr(self.engine, method), *args, **kwargs)

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._on_compute(fn, self.engine, *args, **kwargs)

    def memory(self, release: bool = False) -> dict[str, int]:
        """``{"pid", "rss", "peak_rss"}``: RSS now and at its peak since the previous call.

        ``release`` first hands freed heap memory back to the OS (``release_free_memory``),
        so ``rss`` is what the process holds rather than what its allocator kept.
        """
        if release:
            release_free_memory()
        return {"pid": os.getpid(), "rss": rss_bytes(), "peak_rss": self._memory.take()}


def spawn_engine(
    engine_cls: Any, cfg: dict, num_cpus: float, num_threads: int, name: str, cpus: Sequence[int] | None = None
) -> Any:
    """Start an ``EngineHost`` actor; in colocated mode several hosts share the same CPUs.

    ``cpus``: cores to pin the actor to (disaggregated placement on a local cluster), or None.
    """
    actor = ray.remote(EngineHost).options(num_cpus=num_cpus, name=None, max_concurrency=4)
    return actor.remote(engine_cls, cfg, num_threads, list(cpus) if cpus else None)
