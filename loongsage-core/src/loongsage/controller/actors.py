"""Ray plumbing: start or attach to a cluster, host engines as actors.

Every heavy component is an ``EngineHost`` actor wrapping one engine object built by its
registered class (``from_config(cfg, device=...)``). The controller calls engine methods
through ``call`` and ships small functions that compose several engine calls inside the
actor through ``run`` (so tensors stay in the actor's process).

Devices come from Ray: an actor that was given GPUs (``ray.get_gpu_ids()``; Ray narrows
``CUDA_VISIBLE_DEVICES`` to them) builds its engine on ``cuda:0``, any other on the CPU.
Where an actor sits (its placement-group bundle, pinned cores) is ``controller.placement``'s
job; ``where`` reports what the actor actually got.
"""

from __future__ import annotations

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


def pin_process(cpus: Sequence[int]) -> None:
    """Restrict every thread of this process (and the threads they start) to ``cpus``."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # the thread exited meanwhile
            continue


def assigned_device() -> str:
    """``cuda:0`` when Ray gave this actor a GPU and CUDA sees it, else ``cpu``."""
    import torch

    return "cuda:0" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"


class EngineHost:
    """A Ray actor body holding one engine; ``cpus`` pins it to those cores (Linux)."""

    def __init__(self, engine_cls: Any, cfg: dict, num_threads: int,
                 cpus: Sequence[int] | None = None) -> None:
        import torch
        import transformers
        from omegaconf import OmegaConf

        if cpus:
            pin_process(cpus)
        transformers.utils.logging.disable_progress_bar()
        torch.set_num_threads(num_threads or (len(cpus) if cpus else os.cpu_count()) or 1)
        self.device = assigned_device()
        self.engine = engine_cls.from_config(OmegaConf.create(cfg), device=self.device)

    def where(self) -> dict[str, Any]:
        """Where this actor runs, as Ray and the OS see it (for the run's layout)."""
        import torch

        context = ray.get_runtime_context()
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        return {"node_id": context.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "placement_group_id": context.get_placement_group_id(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "device": self.device,
                "cores": cores, "torch_threads": torch.get_num_threads(), "pid": os.getpid()}

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.engine, method)(*args, **kwargs)

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(self.engine, *args, **kwargs)


def spawn_engine(engine_cls: Any, cfg: dict, seat: Any, placement: Any) -> Any:
    """Start an ``EngineHost`` actor in ``seat``'s bundle of ``placement``."""
    actor = ray.remote(EngineHost).options(max_concurrency=4, **placement.options(seat))
    return actor.remote(engine_cls, cfg, seat.threads, list(seat.cores) if seat.cores else None)
