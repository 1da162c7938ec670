"""The loop's verbs: what one training step of ``run.py`` asks of a built run.

A ``Run`` holds every component ``build.build_run`` started; its methods are the steps of
the loop (turn groups into a batch, train, evaluate, publish new weights, record) and carry
no algorithm choice: those were resolved into the objective, the scheduler and the sources
when the run was built.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import ray
import torch

from loongsage.algorithms.objective import Objective
from loongsage.config.validate import RunConfig
from loongsage.controller.actors import SharedEngine, actor_handle
from loongsage.controller.agent_routers import AgentRouters
from loongsage.controller.batching import attach_rows, groups_to_batch, plan_shards, rollout_metrics
from loongsage.controller.step_extension import StepExtensions
from loongsage.controller.memory import RunMemory
from loongsage.controller.placement import Placement
from loongsage.controller.recording import save_batch
from loongsage.controller.rollout import RolloutManager
from loongsage.controller.run_dir import RunDirectory
from loongsage.controller.train_group import TrainGroup
from loongsage.controller.train_step import TrainStep
from loongsage.data.mixer import apportion
from loongsage.data.sources import evaluation_sources
from loongsage.deadline.pool import DeadlinePool
from loongsage.engines.weight_sync import WeightSync
from loongsage.runtime.event_loop import EventLoopThread
from loongsage.runtime.partial import mask_offpolicy_tokens
from loongsage.tracking.base import sample_rows
from loongsage.transfer import WeightSyncError


@contextmanager
def timed(metrics: dict, key: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    metrics[key] = time.perf_counter() - start


@dataclass
class Run:
    """Everything the training loop touches."""

    spec: RunConfig
    run_dir: RunDirectory
    tokenizer: Any
    objective: Objective
    placement: Placement
    trainers: TrainGroup | None = None
    phases: Any = None  # controller.phases: who holds the devices between steps
    loop: EventLoopThread | None = None
    rollout_actors: list = field(default_factory=list)
    rollout: RolloutManager | None = None
    scheduler: Any = None
    trackers: list = field(default_factory=list)
    sources: dict = field(default_factory=dict)
    weight_sync: WeightSync | None = None
    agent_routers: AgentRouters | None = None
    reward_pool: DeadlinePool | None = None
    memory: RunMemory | None = None
    # the run's step terms, started (config.step_terms, controller.step_extension)
    extensions: StepExtensions = field(default_factory=StepExtensions)
    engine_monitor: Any = None  # controller.engine_health.EngineMonitor
    prompt_check: Any = None  # data.prompt_check.PromptChecker: records skipped while drawing
    resume_from: tuple | None = None  # (folder, state) a resume restores, verified before Ray started
    version: int = 0
    # held while the trainers' weights change or are sent: a restarted engine's weights
    # (engine_health) are never those of a step half trained, nor labelled with a stale version
    weights_lock: threading.Lock = field(default_factory=threading.Lock)
    _bar: Any = None

    @property
    def cfg(self) -> Any:
        return self.spec.cfg

    @property
    def shared_engines(self) -> bool:
        """Whether a rollout engine lives in a train rank's process (``placement.share_process``)."""
        return any(isinstance(actor, SharedEngine) for actor in self.rollout_actors)

    @property
    def monitors_engines(self) -> bool:
        """Whether the engine monitor watches and restarts the engines: asked for, and every
        engine an actor of its own (one sharing a train rank's process restarts with it)."""
        return bool(self.cfg.rollout.health.enable) and not self.shared_engines

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self.tokenizer.eos_token_id

    def to_batch(self, groups: list, metrics: dict) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """The training batch of ``groups``, masking off-policy prefixes when configured."""
        if self.cfg.rollout.mask_offpolicy_in_partial_rollout:
            metrics["rollout/offpolicy_masked_tokens"] = float(mask_offpolicy_tokens(groups))
        return groups_to_batch(groups, self.pad_id)

    def train(self, groups: list, step: int, metrics: dict) -> dict[str, float]:
        """Train on ``groups``: cut into (mini-batch, rank) shards, one batch for all ranks, to
        which the step terms first add their inputs (``before_train``: e.g. per-token values);
        the policy trains unless a step term holds it back (``policy_trains``: a warm-up of the
        term's own model), then the step terms' ``after_train`` runs (training a model of their
        own on the batch); with ``rollout.record`` the groups are first written as the step's
        batch (``recording``); the samples ``record`` saves (the first
        ``logging.samples_per_step``) get their pi_old logprobs, advantages and the step terms'
        per-token fields (``sample_fields``, ``batching.attach_rows``)."""
        train = self.cfg.train
        if self.cfg.rollout.record:  # the step's input as it arrived, before anything masks it
            save_batch(self.run_dir.path, step, groups)
        sources = [source.name for source in self.spec.sources]
        ordered, shards = plan_shards(groups, sources, train.mini_batches_per_step, train.dp_size,
                                      offset=step)
        batch, rewards, group_index = self.to_batch(ordered, metrics)
        row_sources = [g.prompt.source for g in ordered for _ in g.samples]
        step_metrics = self.extensions.before_train(batch, row_sources)
        saved = [s for g in groups for s in g.samples][:self.cfg.logging.samples_per_step]
        row_of = {id(s): row for row, s in enumerate(s for g in ordered for s in g.samples)}
        keep_rows = [row_of[id(s)] for s in saved]
        attach_rows(saved, {name: batch.extras[name][keep_rows] for name in self.extensions.sample_fields})
        if self.extensions.policy_trains(step):
            with self.weights_lock:
                train_metrics, kept = self.trainers.train(batch, rewards, group_index, shards,
                                                          TrainStep(self.objective), keep_rows=keep_rows)
            if kept is not None:
                attach_rows(saved, kept)
            step_metrics.update(train_metrics)
        step_metrics.update(self.extensions.after_train(batch, rewards, group_index))
        return step_metrics

    def eval_due(self, step: int) -> bool:
        interval = self.cfg.trainer.eval_interval
        return interval > 0 and (step % interval == 0 or step == self.cfg.trainer.steps)

    def evaluate(self) -> dict[str, float]:
        """Score the fixed evaluation prompts, one greedy sample each, with current weights.

        Reward failures counted since the last step's end are reported as ``eval/reward_*``:
        exactly the evaluation's under the synchronous scheduler; under the asynchronous one
        they include background rollouts that ended meanwhile.
        """
        prompts = eval_prompts(evaluation_sources(self.sources), self.cfg.trainer.eval_prompts, self.cfg.trainer.seed)
        sampling = {"temperature": self.cfg.trainer.eval_temperature}
        groups = self.rollout.generate_groups(prompts, -len(prompts), self.version, n=1, sampling=sampling)
        metrics = {**rollout_metrics(groups), **self.rollout.reward_metrics()}
        return {f"eval/{k.split('/', 1)[1]}": v for k, v in metrics.items()}

    def publish_weights(self, version: int | None = None) -> dict[str, float]:
        """Send the trainer's weights to every engine as ``version`` (default: the next one),
        then tell the scheduler they are live; return the sync's ``perf/`` metrics (none when no
        engine runs: a run trained from a recording)."""
        if self.weight_sync is None:
            self.version = self.version + 1 if version is None else version
            self.scheduler.on_weights_updated(self.version)
            return {}
        with self.weights_lock:
            self.version = self.version + 1 if version is None else version
            try:
                metrics, failure = self.weight_sync.push(self.version), None
            except WeightSyncError as err:
                metrics, failure = {}, err
        if failure is not None:  # outside the lock: a restart takes it to send this version
            if self.engine_monitor is None or not self.engine_monitor.heal(self.version):
                raise failure
            metrics = self.weight_sync.metrics()
        self.scheduler.on_weights_updated(self.version)
        return metrics

    def record(self, step: int, metrics: dict[str, float], groups: list) -> None:
        metrics["train/weight_version"] = float(self.version)
        if self.memory is not None:
            metrics.update(self.memory.step_metrics())
        for tracker in self.trackers:
            tracker.log(metrics, step)
        saved = self.run_dir.write_samples(step, groups, self.tokenizer, self.cfg.logging.samples_per_step)
        every = self.cfg.logging.tracker_samples_every
        if every > 0 and step % every == 0 and saved:
            rows = sample_rows(saved)
            for tracker in self.trackers:
                tracker.log_samples(rows, step)
        if self._bar is not None:
            self._bar.set_postfix(
                reward=f"{metrics.get('rollout/reward_mean', float('nan')):.3f}",
                loss=f"{metrics.get('train/loss', float('nan')):.3f}",
                t=f"{metrics.get('timing/step', 0.0):.1f}s",
            )

    def progress(self, steps: Iterable[int]) -> Iterable[int]:
        from tqdm import tqdm

        steps = list(steps)
        show = self.cfg.logging.progress_bar and sys.stderr.isatty()
        self._bar = tqdm(steps, desc="train", disable=not show, dynamic_ncols=True) if show else None
        return self._bar if self._bar is not None else steps

    def data_metrics(self) -> dict[str, float]:
        """Records the prompt check skipped while drawing (none drawn from a recording)."""
        return self.prompt_check.metrics() if self.prompt_check is not None else {}

    def engine_metrics(self) -> dict[str, float]:
        """Requests per engine, the monitor's retries and restarts, and failed trajectories,
        since the last call."""
        metrics = {**self.rollout.engine_metrics(), **self.rollout.failure_metrics()}
        if self.engine_monitor is not None:
            metrics.update(self.engine_monitor.metrics())
        return metrics

    def close(self) -> None:
        if self.engine_monitor is not None:
            self.engine_monitor.close()
        for tracker in self.trackers:
            tracker.close()
        if self.memory is not None:
            self.memory.close()
        self.extensions.close()
        if self.scheduler is not None:
            self.scheduler.close()
        if self.agent_routers is not None:
            self.agent_routers.close()
        if self.loop is not None:
            self.loop.close()
        if self.reward_pool is not None:
            self.reward_pool.close()
        if self.weight_sync is not None:
            self.weight_sync.close()
        if self._bar is not None:
            self._bar.close()
        if self.trainers is not None:
            self.trainers.kill()
        for actor in self.rollout_actors:
            ray.kill(actor_handle(actor))
        self.placement.remove()


def eval_prompts(sources: dict, total: int, seed: int) -> list:
    """A fixed evaluation set: ``total`` prompts split over sources by weight, seeded."""
    weights = [Fraction(s.weight).limit_denominator(10**6) for s in sources.values()]
    counts = apportion(total, [w / sum(weights) for w in weights])
    prompts = []
    for source, count in zip(sources.values(), counts):
        size = source.size()
        rng = random.Random(f"eval:{seed}:{source.name}")
        indices = rng.sample(range(size), min(count, size)) if size else list(range(count))
        prompts += [source.get(i) for i in indices]
    return prompts
