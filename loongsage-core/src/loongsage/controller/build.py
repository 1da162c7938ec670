"""Build every component of a run from its resolved config, and tear it down again.

``build_run`` starts (or attaches to) Ray, reserves the placement groups
(``controller.placement``), hosts the train ranks and the rollout engines as actors in
their bundles (printing the layout and saving it as ``layout.json``), joins the train
ranks into one process group (``TrainGroup``), and builds the data sources, the mixer, the
engine pool (the one load balancer), the AgentFlow routers, the reward worker processes
(``reward.workers``), the rollout manager and the scheduler on the run's one rollout event
loop, the run's step terms (``config.step_terms``: plugins extending the training step, with
any actors of their own beside train rank 0; ``step_extension.py``), the objective, the
trackers and the engine monitor (``engine_health.py``), and returns a ``Run`` whose verbs
the loop in ``run.py`` calls. Nothing here chooses an algorithm or looks a plugin name up:
every plugin arrives resolved in the ``RunConfig``.

Which scheduler: the synchronous one (``SyncScheduler``: dispatch a step's groups, wait for
all, apply the data filters) unless the config asks for overlap (``async.enable``), partial
rollout, or oversampling (``rollout.oversample_groups``), which the asynchronous scheduler's
pipeline implements (without ``async.enable`` its window is synchronous, S = 0: B + O groups
are dispatched, the first B to finish are trained and the rest carry over to the next step).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
from omegaconf import DictConfig

from loongsage.agentflow.settings import RouterSettings
from loongsage.algorithms.filters import FilterChain, FilterResult
from loongsage.algorithms.objective import Objective
from loongsage.config.validate import RunConfig, as_container
from loongsage.controller.actors import add_shared_engine, shares_process, spawn_engine, start_ray
from loongsage.controller.agent_routers import AgentRouters
from loongsage.controller.engine_health import EngineMonitor
from loongsage.controller.memory import RunMemory
from loongsage.controller.memory_budget import check_run_memory
from loongsage.controller.phases import PHASES
from loongsage.controller.placement import Placement, Seat, format_layout, layout, plan_placement
from loongsage.controller.recorded_rollout import RecordedBatches, RecordedRollout, check_recording
from loongsage.controller.rollout import RolloutManager
from loongsage.controller.run_dir import RunDirectory
from loongsage.controller.startup_block import data_line, run_lines
from loongsage.controller.step_extension import StepExtensions
from loongsage.models.folder_check import check_model_folder
from loongsage.controller.train_group import TrainGroup
from loongsage.controller.verbs import Run
from loongsage.data.mixer import DataMixer
from loongsage.data.scoring import RewardScorer, reward_modules
from loongsage.data.prompt_check import CheckedSource, prompt_checker
from loongsage.data.sources import build_sources, training_sources
from loongsage.deadline.budget import Budget
from loongsage.deadline.pool import DeadlinePool
from loongsage.engines.client import EngineClient
from loongsage.engines.pool import EnginePool
from loongsage.engines.protocols import check_rollout_engine
from loongsage.engines.routing import config_is_moe
from loongsage.models.resolve import resolve_model_path
from loongsage.runtime.event_loop import EventLoopThread
from loongsage.runtime.prompt_source import BatchedPromptSource
from loongsage.runtime.scheduler import async_scheduler_from_config
from loongsage.runtime.sync_scheduler import SyncScheduler
from loongsage.transfer import TransferConfig

log = logging.getLogger(__name__)

def data_filters(spec: RunConfig) -> tuple[Any, int]:
    """One chain: each source's own filters on its groups, then ``algorithm.filters``."""
    budget = Budget(spec.cfg.budgets.filter_s, "budgets.filter_s")
    chain = FilterChain(spec.algorithm.filters, budget)
    per_source = {s.name: FilterChain(s.filters, budget) for s in spec.sources}

    def apply(groups: list) -> FilterResult:
        metrics: dict[str, float] = {}
        kept = []
        for name, source_chain in per_source.items():
            result = source_chain([g for g in groups if g.prompt.source == name])
            kept += result.groups
            for key, value in result.metrics.items():
                metrics[key] = metrics.get(key, 0.0) + value
        result = chain(sorted(kept, key=lambda g: g.group_id))
        for key, value in result.metrics.items():
            metrics[key] = metrics.get(key, 0.0) + value
        return FilterResult(result.groups, metrics)

    rounds = max([chain.max_rounds, *(c.max_rounds for c in per_source.values())])
    return apply, rounds


def build_scheduler(spec: RunConfig, mixer: DataMixer, rollout: RolloutManager, loop: EventLoopThread) -> Any:
    """The synchronous scheduler, or the pipeline one for overlap, partial rollout or oversampling."""
    cfg = spec.cfg
    if not (cfg["async"].enable or cfg.rollout.partial or cfg.rollout.oversample_groups):
        filters, rounds = data_filters(spec)
        return SyncScheduler(mixer, rollout.generate_groups, cfg.rollout.prompts_per_step, filters, rounds)
    return async_scheduler_from_config(
        cfg,
        spec.window_policy,
        prompt_source=BatchedPromptSource(mixer, cfg.rollout.prompts_per_step),
        rollout_group=rollout.generate_group,
        abort_inflight=rollout.abort_for_update if cfg.rollout.partial else None,
        resume_inflight=rollout.resume_after_update,
        continues_in_place=rollout.continues_in_place,
        loop=loop,
    )


def build_trackers(spec: RunConfig, run_dir: RunDirectory) -> list:
    plain = as_container(spec.cfg)
    return [ref.obj(ref.params, run_dir.path, plain) for ref in spec.trackers]


def sampling_params(cfg: DictConfig, tokenizer: Any) -> dict[str, Any]:
    r = cfg.rollout
    return {
        "temperature": r.temperature,
        "top_p": r.top_p,
        "top_k": r.top_k,
        "max_new_tokens": r.max_new_tokens,
        "stop_token_ids": [tokenizer.eos_token_id],
    }


def local_cores(cfg: DictConfig) -> list[int] | None:
    """This machine's cores, when a disaggregated run on a local cluster pins its actors.

    Colocated phases take turns on every core; a remote cluster (``placement.ray_address`` /
    ``RAY_ADDRESS``) places actors on other machines, so neither is pinned.
    """
    remote = cfg.placement.ray_address or os.environ.get("RAY_ADDRESS")
    if cfg.placement.mode != "disaggregated" or remote or not hasattr(os, "sched_getaffinity"):
        return None
    return sorted(os.sched_getaffinity(0))


def _start_actors(run: Run, plain: dict, rollout: bool) -> None:
    """Every actor in its seat, the layout printed and saved, the train ranks joined."""
    spec, placement = run.spec, run.placement
    train_seats = placement.plan.role("train")
    rollout_seats = placement.plan.role("rollout") if rollout else []
    hosts = host_seats(plain, spec.rollout_engine.obj, train_seats, rollout_seats)
    trainers = [spawn_engine(spec.train_engine.obj, plain, hosts.get(seat.rank, seat), placement)
                for seat in train_seats]
    run.rollout_actors = [
        add_shared_engine(trainers[seat.rank], spec.rollout_engine.obj, plain, seat.threads)
        if seat.rank in hosts else spawn_engine(spec.rollout_engine.obj, plain, seat, placement)
        for seat in rollout_seats]
    run.trainers = TrainGroup(trainers)
    actors = trainers + run.rollout_actors
    reports = ray.get([actor.where.remote() for actor in actors])
    rows = layout(placement, train_seats + rollout_seats, reports)
    log.info(format_layout(rows))
    run.run_dir.write_layout(placement.plan.mode, rows)
    run.trainers.connect(rows[0]["node_ip"], run.cfg.train.strategy)


def host_seats(cfg: Any, engine_cls: Any, train_seats: list[Seat], rollout_seats: list[Seat]) -> dict[int, Seat]:
    """Rank -> its train seat, booking its engine's share of the bundle too, for every train rank
    whose process also holds rollout engine ``rank`` (``actors.shares_process``)."""
    if not rollout_seats or not shares_process(cfg, engine_cls):
        return {}
    trains = {seat.rank: seat for seat in train_seats}
    return {seat.rank: dataclasses.replace(trains[seat.rank], num_cpus=trains[seat.rank].num_cpus + seat.num_cpus,
                                           num_gpus=trains[seat.rank].num_gpus + seat.num_gpus)
            for seat in rollout_seats if seat.rank in trains}


def _start_rollout(run: Run, plain: dict) -> None:
    """Weight sync, engine pool, routers, rollout manager, scheduler and phases."""
    cfg, spec = run.cfg, run.spec
    urls = ray.get([a.call.remote("start") for a in run.rollout_actors])
    transfer = TransferConfig(**plain["transfer"])
    # the engine class knows how its weights arrive (engines.protocols.RolloutEngine)
    run.weight_sync = spec.rollout_engine.obj.weight_sync(plain, run.trainers, run.rollout_actors, transfer)
    health = cfg.rollout.health
    if health.enable and run.shared_engines:
        log.debug("rollout.health: the engines live in their train ranks' processes (placement.share_process), "
                 "so no engine monitor runs; an engine that fails fails its rank (trainer.auto_resume)")
    routes = config_is_moe(cfg.model.path)  # MoE: generations return routes (R3, routing mismatch)
    # without the monitor nothing restarts a dead engine: a failed request fails at once
    pool = EnginePool([EngineClient(url, return_routed_experts=routes) for url in urls],
                      max_attempts=health.max_attempts if run.monitors_engines else 1, wait_s=health.restart_timeout_s)
    run.loop = EventLoopThread()
    base = RouterSettings.from_config(cfg.agentflow, spec.router)
    run.agent_routers = AgentRouters(run.sources, pool, run.tokenizer, base, run.run_dir.path)
    for name, url in run.agent_routers.urls().items():
        log.info(f"agentflow router for data source {name!r}: {url}")
    run.reward_pool = DeadlinePool(cfg.reward.workers, preload=reward_modules(run.sources))
    scorer = RewardScorer(run.reward_pool, cfg.reward.drop_group_retries)
    run.rollout = RolloutManager(run.sources, pool, run.loop, cfg.rollout.n_samples_per_prompt,
                                 sampling_params(cfg, run.tokenizer), scorer,
                                 on_scored=run.agent_routers.record_rewards,
                                 failed_trajectory=cfg.rollout.failed_trajectory,
                                 seed=cfg.trainer.seed)
    checked = [CheckedSource(source, run.prompt_check) for source in training_sources(run.sources).values()]
    mixer = DataMixer.from_sources(checked, cfg.trainer.seed,
                                   batch_size=cfg.rollout.prompts_per_step,
                                   mini_batches=cfg.train.mini_batches_per_step,
                                   dp_size=cfg.train.dp_size)
    run.scheduler = build_scheduler(spec, mixer, run.rollout, run.loop)
    run.phases = PHASES[cfg.placement.mode](run.scheduler, run.trainers, run.rollout_actors, run.extensions)


def _start_recorded(run: Run, recording: Any) -> None:
    """The recorded batches as the run's scheduler, and no engine (``recorded_rollout``)."""
    run.scheduler = RecordedBatches(recording)
    run.rollout = RecordedRollout()
    run.phases = PHASES[run.cfg.placement.mode](run.scheduler, run.trainers, run.rollout_actors, run.extensions)
    log.info(f"rollout.from_recording: training on the batches recorded in {recording}; no rollout engine runs")


@contextmanager
def build_run(spec: RunConfig, rollout: bool = True) -> Iterator[Run]:
    """Start every component of ``spec`` in a run directory it holds (``RunDirectory.claimed``:
    refused before anything starts when another run owns it); close them all on exit, also
    after errors. With ``rollout.from_recording`` the rollout is the recording's batches: no
    engine starts."""
    recording = None
    if rollout and spec.cfg.rollout.from_recording:
        recording = check_recording(spec.cfg.rollout.from_recording, spec.cfg.trainer.steps,
                                    spec.cfg.trainer.eval_interval)
    cfg = spec.cfg.copy()
    cfg.model.path = str(resolve_model_path(cfg.model.path))
    given_model, spec = spec.cfg.model.path, dataclasses.replace(spec, cfg=cfg)
    with RunDirectory.for_config(cfg).claimed(cfg.trainer.resume, cfg.trainer.overwrite) as run_dir:
        for line in run_lines(spec, given_model, run_dir.path):
            log.info(line)
        with _started(spec, run_dir, rollout, recording) as run:
            yield run


@contextmanager
def _started(spec: RunConfig, run_dir: RunDirectory, rollout: bool, recording: Any) -> Iterator[Run]:
    """``build_run`` in a run directory this run holds."""
    from transformers import AutoTokenizer

    cfg = spec.cfg
    engines = rollout and recording is None
    if engines:
        check_rollout_engine(spec.rollout_engine.obj, spec.rollout_engine.name)
    run_dir.write_config(cfg)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or cfg.model.path)
    check_model_folder(Path(cfg.model.path), tokenizer)
    resume_from = run_dir.resume_checkpoint() if cfg.trainer.resume else None  # verified before Ray starts
    start_ray(cfg.placement)
    plan = plan_placement(cfg, local_cores(cfg))
    fixed = not (cfg.placement.ray_address or os.environ.get("RAY_ADDRESS"))  # a local cluster cannot grow
    placement = Placement.reserve(plan, cfg.placement.nodes, cfg.placement.timeout_s, fixed)
    run = Run(spec, run_dir, tokenizer, Objective(spec.algorithm), placement, resume_from=resume_from)
    try:
        run.sources = build_sources(spec.sources, spec.registries, cfg.trainer.seed, tokenizer)
        log.info(data_line(run.sources))
        if engines:
            run.prompt_check = prompt_checker(cfg, tokenizer)
            run.prompt_check.scan(run.sources)
        hosted = host_seats(cfg, spec.rollout_engine.obj, plan.role("train"), plan.role("rollout") if engines else [])
        estimate = check_run_memory(cfg, run.sources, tokenizer, spec.step_terms,
                                    engines_in_train_processes=len(hosted))
        if estimate:
            log.info(estimate)
        _start_actors(run, as_container(cfg), engines)
        if rollout:  # an RL run (engines or a recording): its step terms extend every step
            run.extensions = StepExtensions.start(spec.step_terms, as_container(cfg), plan.role("train")[0],
                                                  placement, spec.algorithm)
            run.objective = Objective(spec.algorithm, run.extensions.train_term)
        if engines:
            _start_rollout(run, as_container(cfg))
        elif recording is not None:
            _start_recorded(run, recording)
        run.memory = RunMemory.for_run(cfg, run.trainers.actors, run.rollout_actors, run.extensions.actors)
        run.trackers = build_trackers(spec, run_dir)
        if engines and run.monitors_engines:
            run.engine_monitor = EngineMonitor(run, run.rollout.pool, as_container(cfg),
                                               run_dir.path / "engine_events.jsonl").start()
        yield run
    finally:
        run.close()
