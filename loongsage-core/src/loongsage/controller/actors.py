"""Ray plumbing: start or attach to a cluster, host engines as actors.

Every heavy component is an ``EngineHost`` actor wrapping one engine object built by its
registered class (``from_config(cfg, device=...)``). The controller calls engine methods
through ``call`` and ships small functions that compose several engine calls inside the
actor through ``run`` (so tensors stay in the actor's process).

Every engine call runs on one dedicated compute thread of its host. Ray gives an actor with
``max_concurrency`` > 1 a thread pool and hands successive calls to successive threads, and
glibc gives each thread its own malloc arena: a train step on a new thread could not reuse
the memory the previous step freed in another arena, so the train actor kept about one
step's worth of activations per pool thread (measured on SmolLM2: 4.2 GB after 9 steps on
one thread, 10.6 GB with calls rotating over 4 threads). The pool's other threads stay free
for ``memory``, ``where`` and ``inspect``, which must answer while a step runs.

A colocated rollout engine whose class allows it (``shares_process``) lives in its train
rank's process by default (``placement.share_process``): the host holds a second engine in
slot ``rollout`` and the controller reaches it through a ``SharedEngine``, which answers the
same ``.call`` / ``.run`` / ``.inspect`` / ``.memory`` / ``.where`` / ``.release_memory``
calls as an actor handle. The two take turns on the bundle anyway; one process saves the
second copy of torch and transformers (about 10 CPU-seconds of start-up and 0.3 GB of summed
PSS on a one-step tiny run, docs/cluster.md). The price: the engine cannot be killed and restarted alone, so
its failure is its train rank's (``trainer.auto_resume`` resumes from the step snapshot,
``step_snapshot``), and the engine monitor does not run.

Devices come from Ray: an actor that was given GPUs (``ray.get_gpu_ids()``; Ray narrows
``CUDA_VISIBLE_DEVICES`` to them) builds its engine on ``cuda:0``, any other on the CPU.
Where an actor sits (its placement-group bundle, pinned cores) is ``controller.placement``'s
job; ``where`` reports what the actor actually got.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import ray

from loongsage.controller.memory import PeakSampler, rss_bytes
from loongsage.controller.ray_sessions import daemons_in_own_sessions, end_monitor_first_at_exit, start_reaper
from loongsage.engines.memory import release_free_memory
from loongsage.engines.openmp_wait import openmp_wait_env
from loongsage.logs import ROOT

# A local cluster starts no idle workers ahead of time: Ray prestarts one per CPU for the
# first driver, but a run's actors carry the job's runtime env, which those workers were not
# started with, so they sat idle for the whole run (about 45 MB of PSS each).
LOCAL_SYSTEM_CONFIG = {"prestart_worker_first_driver": False}

MAIN = "main"  # the slot of the engine a host was started with
SHARED_SLOT = "rollout"  # the slot of a rollout engine living in its train rank's process


def start_ray(placement: Any) -> None:
    """Attach to ``placement.ray_address`` / ``RAY_ADDRESS``, else start a local cluster whose
    daemons run in sessions of their own and end with this process (``ray_sessions``). Ray logs
    at LoongSage's level: under ``-q`` its INFO lines ("Started a local Ray instance") stay out
    of the output like LoongSage's own."""
    if ray.is_initialized():
        return
    address = placement.ray_address or os.environ.get("RAY_ADDRESS")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    runtime_env = actor_runtime_env(os.environ)
    level = logging.INFO if logging.getLogger(ROOT).isEnabledFor(logging.INFO) else logging.WARNING
    if address:
        ray.init(address=address, ignore_reinit_error=True, runtime_env=runtime_env, logging_level=level)
        return
    with daemons_in_own_sessions() as daemons:  # a signal to the driver's group reaches the driver only
        ray.init(
            logging_level=level,
            num_cpus=placement.num_cpus or os.cpu_count(),
            include_dashboard=False,
            object_store_memory=placement.object_store_memory,
            ignore_reinit_error=True,
            log_to_driver=True,
            runtime_env=runtime_env,
            _system_config=LOCAL_SYSTEM_CONFIG,
        )
    start_reaper(daemons)  # and every one of them goes when the driver does, however it ends
    end_monitor_first_at_exit()  # a normal exit does not wait a second on Ray's autoscaler monitor


def actor_runtime_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """The job's runtime env: every actor's OpenMP threads wait as the driver's were told to
    (``engines.openmp_wait``: a short spin unless the environment chose otherwise)."""
    return {"env_vars": openmp_wait_env(environ)}


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
    """A Ray actor body holding one engine; ``cpus`` pins it to those cores (Linux).

    The engine is built, called and run on the host's single compute thread (see the module
    docstring); ``memory`` reports the process's RSS from whichever Ray thread it lands on.
    """

    def __init__(self, engine_cls: Any, cfg: dict, num_threads: int, cpus: Sequence[int] | None = None) -> None:
        import transformers

        if cpus:
            pin_process(cpus)
        self._compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loongsage-engine")
        transformers.utils.logging.disable_progress_bar()
        self._threads = num_threads or (len(cpus) if cpus else os.cpu_count()) or 1
        self.device = assigned_device()
        self.engines: dict[str, Any] = {}
        self._memory: dict[str, PeakSampler] = {}
        self.add_engine(MAIN, engine_cls, cfg)

    @property
    def engine(self) -> Any:
        return self.engines[MAIN]

    def add_engine(self, slot: str, engine_cls: Any, cfg: dict) -> None:
        """Build a further engine in this process, reached as slot ``slot`` (``SharedEngine``)."""
        from omegaconf import OmegaConf

        self._memory[slot] = PeakSampler(rss_bytes, interval_s=0.05)
        self.engines[slot] = self._on_compute(self._build, engine_cls, OmegaConf.create(cfg), self._threads,
                                              self.device)

    @staticmethod
    def _build(engine_cls: Any, cfg: Any, threads: int, device: str) -> Any:
        from loongsage.engines.cpu_threads import prepare_compute_thread

        prepare_compute_thread(threads)
        return engine_cls.from_config(cfg, device=device)

    def _on_compute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._compute.submit(fn, *args, **kwargs).result()

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
        return self.call_in(MAIN, method, *args, **kwargs)

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.run_in(MAIN, fn, *args, **kwargs)

    def inspect(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(engine, *args)`` on a Ray thread, beside whatever the compute thread runs: for
        cheap reads of progress a running call publishes (``sft_progress``), never for work."""
        return self.inspect_in(MAIN, fn, *args)

    def call_in(self, slot: str, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._on_compute(getattr(self.engines[slot], method), *args, **kwargs)

    def run_in(self, slot: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._on_compute(fn, self.engines[slot], *args, **kwargs)

    def inspect_in(self, slot: str, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(self.engines[slot], *args)

    def release_memory(self) -> int:
        """Hand freed heap memory back to the OS (``release_free_memory``); the RSS after it.

        A colocated engine does this when it hands the bundle to the trainer: what its
        generation freed (KV cache, activations) would otherwise stay in its heap through
        the train phase, on top of the trainer's peak. The peak window of ``memory`` is
        left alone.
        """
        release_free_memory()
        return rss_bytes()

    def memory(self, release: bool = False) -> dict[str, int]:
        """``{"pid", "rss", "peak_rss"}``: RSS now and at its peak since the previous call.

        ``release`` first hands freed heap memory back to the OS (``release_free_memory``),
        so ``rss`` is what the process holds rather than what its allocator kept.
        """
        return self.memory_in(MAIN, release)

    def memory_in(self, slot: str, release: bool = False) -> dict[str, int]:
        """``memory`` with the peak window of ``slot``: the process's figures, each slot's
        peak measured since that slot's previous call."""
        if release:
            release_free_memory()
        return {"pid": os.getpid(), "rss": rss_bytes(), "peak_rss": self._memory[slot].take()}


@dataclass(frozen=True)
class _Addressed:
    """``method.remote(slot, ...)`` called as ``.remote(...)``: an actor method bound to a slot."""

    method: Any
    slot: str

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.method.remote(self.slot, *args, **kwargs)


class SharedEngine:
    """An engine in slot ``slot`` of another engine's host actor, called like an actor handle.

    ``.call``, ``.run``, ``.inspect`` and ``.memory`` reach the slot's engine; ``.where`` and
    ``.release_memory`` are the process's, so they go to the host as they are.
    """

    def __init__(self, host: Any, slot: str = SHARED_SLOT) -> None:
        self.host = host
        self.call = _Addressed(host.call_in, slot)
        self.run = _Addressed(host.run_in, slot)
        self.inspect = _Addressed(host.inspect_in, slot)
        self.memory = _Addressed(host.memory_in, slot)
        self.where = host.where
        self.release_memory = host.release_memory


def actor_handle(actor: Any) -> Any:
    """The Ray actor behind ``actor`` (its host for a ``SharedEngine``): what ``ray.kill`` takes."""
    return actor.host if isinstance(actor, SharedEngine) else actor


def shares_process(cfg: Any, engine_cls: Any) -> bool:
    """Whether this run's rollout engines live in their train ranks' processes: a colocated run
    with ``placement.share_process`` and an engine class that allows it (``shares_process``)."""
    placement = cfg["placement"]
    return (placement["mode"] == "colocated" and bool(placement["share_process"])
            and bool(getattr(engine_cls, "shares_process", False)))


def add_shared_engine(host: Any, engine_cls: Any, cfg: dict, threads: int) -> SharedEngine:
    """Build a rollout engine in ``host``'s process and return the handle to it.

    The engine's decode thread gets ``threads`` (its seat's) unless ``rollout.num_threads``
    set a count: in an actor of its own it would inherit the count its host's compute thread
    set, which here is the train rank's.
    """
    rollout = dict(cfg.get("rollout") or {})
    rollout["num_threads"] = rollout.get("num_threads") or threads
    ray.get(host.add_engine.remote(SHARED_SLOT, engine_cls, {**cfg, "rollout": rollout}))
    return SharedEngine(host)


def spawn_engine(engine_cls: Any, cfg: dict, seat: Any, placement: Any = None) -> Any:
    """Start an ``EngineHost`` actor in ``seat``'s bundle of ``placement``; without a
    placement (one host outside a run: tests, benchmarks) it books the seat's CPUs and GPUs."""
    options = placement.options(seat) if placement is not None else {
        "num_cpus": seat.num_cpus, "num_gpus": seat.num_gpus}
    actor = ray.remote(EngineHost).options(max_concurrency=4, **options)
    return actor.remote(engine_cls, cfg, seat.threads, list(seat.cores) if seat.cores else None)
