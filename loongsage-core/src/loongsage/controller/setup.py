"""Build every component of a run from its validated config, and tear it down again.

``build_run`` starts (or attaches to) Ray, hosts the train engine and the rollout engines
as actors, builds the data sources, the mixer, the rollout manager, the scheduler, the
objective and the trackers, and returns a ``Run`` whose methods the loop in ``run.py``
calls. Nothing here chooses an algorithm: every choice is a registry lookup.
"""

from __future__ import annotations

import os
import random
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import ray
import torch
from omegaconf import DictConfig, OmegaConf

from loongsage.algorithms.filters import FilterChain, FilterResult
from loongsage.algorithms.objective import Objective
from loongsage.config.validate import as_container
from loongsage.controller.actors import spawn_engine, split_cores, start_ray
from loongsage.controller.agent_routers import AgentRouters
from loongsage.controller.batching import groups_to_batch, rollout_metrics
from loongsage.controller.memory import RunMemory
from loongsage.controller.memory_budget import check_run_memory
from loongsage.controller.rollout import RolloutManager
from loongsage.controller.run_dir import RunDirectory
from loongsage.controller.trainer_ops import train_on_rollout
from loongsage.controller.weight_sync import WeightSync
from loongsage.data.mixer import DataMixer
from loongsage.data.sources import build_sources
from loongsage.engines.client import EngineClient
from loongsage.models.resolve import resolve_model_path
from loongsage.registry import Registries
from loongsage.transfer import TransferConfig
from loongsage.runtime.partial import mask_offpolicy_tokens
from loongsage.runtime.prompt_source import BatchedPromptSource
from loongsage.runtime.scheduler import async_scheduler_from_config
from loongsage.runtime.sync_scheduler import SyncScheduler


@dataclass
class Run:
    """Everything the training loop touches."""

    cfg: DictConfig
    registries: Registries
    run_dir: RunDirectory
    tokenizer: Any
    train_actor: Any
    objective: Objective
    rollout_actors: list = field(default_factory=list)
    rollout: RolloutManager | None = None
    scheduler: Any = None
    trackers: list = field(default_factory=list)
    sources: dict = field(default_factory=dict)
    weight_sync: WeightSync | None = None
    agent_routers: AgentRouters | None = None
    memory: RunMemory | None = None
    version: int = 0
    _bar: Any = None

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self.tokenizer.eos_token_id

    # the loop's verbs --------------------------------------------------------------

    def to_batch(self, groups: list, metrics: dict) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """The training batch of ``groups``, masking off-policy prefixes when configured."""
        if self.cfg.rollout.mask_offpolicy_in_partial_rollout:
            metrics["rollout/offpolicy_masked_tokens"] = float(mask_offpolicy_tokens(groups))
        return groups_to_batch(groups, self.pad_id)

    def train(self, batch: Any, rewards: torch.Tensor, group_index: torch.Tensor) -> dict[str, float]:
        ref = self.train_actor.run.remote(
            train_on_rollout,
            batch,
            rewards,
            group_index,
            self.objective,
            as_container(self.cfg.algorithm),
            self.cfg.train.mini_batches_per_step,
        )
        return ray.get(ref)

    def eval_due(self, step: int) -> bool:
        interval = self.cfg.trainer.eval_interval
        return interval > 0 and (step % interval == 0 or step == self.cfg.trainer.steps)

    def evaluate(self) -> dict[str, float]:
        """Score the fixed evaluation prompts, one greedy sample each, with current weights."""
        prompts = eval_prompts(self.sources, self.cfg.trainer.eval_prompts, self.cfg.trainer.seed)
        sampling = {"temperature": self.cfg.trainer.eval_temperature}
        groups = self.rollout.generate_groups(prompts, -len(prompts), self.version, n=1, sampling=sampling)
        return {f"eval/{k.split('/', 1)[1]}": v for k, v in rollout_metrics(groups).items()}

    def sync_weights(self) -> int:
        """Send the trainer's weights to every rollout engine as a new version; return it."""
        self.version += 1
        self.weight_sync.push(self.version)
        return self.version

    def record(self, step: int, metrics: dict[str, float], groups: list) -> None:
        metrics["train/weight_version"] = float(self.version)
        if self.memory is not None:
            metrics.update(self.memory.step_metrics())
        for tracker in self.trackers:
            tracker.log(metrics, step)
        self.run_dir.write_samples(step, groups, self.tokenizer, self.cfg.logging.samples_per_step)
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

    # warm start, checkpoints, resume -------------------------------------------------

    def warm_start(self) -> None:
        """Supervised warm start on the data sources' reference answers (trainer.sft)."""
        from loongsage.models.sft import sft_examples, train_sft

        sft = self.cfg.trainer.sft
        if sft.steps <= 0:
            return
        examples = sft_examples(self.sources, sft.examples, seed=self.cfg.trainer.seed)
        losses = ray.get(self.train_actor.run.remote(train_sft, examples, sft.steps, sft.batch_size, sft.lr))
        peak = self.memory.step_metrics().get("perf/train_rss_peak_gb", 0.0) if self.memory else 0.0
        print(f"sft warm start: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {len(losses)} steps "
              f"(train actor RSS peak {peak:.2f} GB)", flush=True)
        if self.rollout_actors:
            self.scheduler.on_weights_updated(self.sync_weights())

    def save_model(self, folder: str) -> None:
        """Save the trainer's weights and tokenizer as a Hugging Face folder."""
        ray.get(self.train_actor.call.remote("save", folder))

    def checkpoint_due(self, step: int) -> bool:
        interval = self.cfg.checkpoint.interval
        last = step == self.cfg.trainer.steps - 1
        return last or (interval > 0 and (step + 1) % interval == 0)

    def save_checkpoint(self, step: int) -> None:
        tmp = self.run_dir.begin_checkpoint(step)
        ray.get(self.train_actor.call.remote("save", str(tmp / "trainer")))
        state = {
            "step": step,
            "version": self.version,
            "scheduler": self.scheduler.state_dict() if self.scheduler else None,
        }
        self.run_dir.commit_checkpoint(step, tmp, state, self.cfg.checkpoint.keep_last)

    def resume_or_warm_start(self) -> int:
        """Restore the latest checkpoint when resuming; otherwise warm start. Return first step."""
        latest = self.run_dir.latest_checkpoint() if self.cfg.trainer.resume else None
        if latest is None:
            self.warm_start()
            return 0
        folder, state = latest
        ray.get(self.train_actor.call.remote("load", str(folder / "trainer")))
        self.version = state["version"]
        if self.scheduler and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        for tracker in self.trackers:
            if hasattr(tracker, "truncate_before"):
                tracker.truncate_before(state["step"] + 1)
        if self.rollout_actors:
            self.weight_sync.push(self.version)
            self.scheduler.on_weights_updated(self.version)
        print(f"resumed from {folder.name}: continuing at step {state['step'] + 1}", flush=True)
        return state["step"] + 1

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        if self.memory is not None:
            self.memory.close()
        if self.scheduler is not None:
            self.scheduler.close()
        if self.rollout is not None:
            self.rollout.close()
        if self.agent_routers is not None:
            self.agent_routers.close()
        if self.weight_sync is not None:
            self.weight_sync.close()
        if self._bar is not None:
            self._bar.close()
        for actor in [self.train_actor, *self.rollout_actors]:
            ray.kill(actor)


def eval_prompts(sources: dict, total: int, seed: int) -> list:
    """A fixed evaluation set: ``total`` prompts split over sources by weight, seeded."""
    from fractions import Fraction

    from loongsage.data.mixer import apportion

    weights = [Fraction(s.weight).limit_denominator(10**6) for s in sources.values()]
    counts = apportion(total, [w / sum(weights) for w in weights])
    prompts = []
    for source, count in zip(sources.values(), counts):
        size = source.size()
        rng = random.Random(f"eval:{seed}:{source.name}")
        indices = rng.sample(range(size), min(count, size)) if size else list(range(count))
        prompts += [source.get(i) for i in indices]
    return prompts


def _filters(cfg: DictConfig, registries: Registries) -> tuple[Any, int]:
    """One chain: each source's own filters on its groups, then ``algorithm.filters``."""
    chain = FilterChain.from_config(cfg.algorithm.filters, registries)
    per_source = {
        s.name: FilterChain.from_config(s.filters, registries, f"data_sources[{i}].filters")
        for i, s in enumerate(cfg.data_sources)
    }

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


def _build_scheduler(cfg: DictConfig, registries: Registries, mixer: DataMixer, rollout: RolloutManager) -> Any:
    """Synchronous unless the config asks for overlap (async) or partial rollout."""
    if not (cfg["async"].enable or cfg.rollout.partial):
        filters, rounds = _filters(cfg, registries)
        return SyncScheduler(mixer, rollout.generate_groups, cfg.rollout.prompts_per_step, filters, rounds)
    return async_scheduler_from_config(
        cfg,
        prompt_source=BatchedPromptSource(mixer, cfg.rollout.prompts_per_step),
        rollout_group=rollout.generate_group,
        abort_inflight=rollout.abort_all if cfg.rollout.partial else None,
        registries=registries,
    )


def _trackers(cfg: DictConfig, registries: Registries, run_dir: RunDirectory) -> list:
    trackers = []
    for i, ref in enumerate(cfg.logging.trackers):
        entry = registries.tracker.entry(ref["name"], f"logging.trackers[{i}].name")
        params = entry.build_params({k: v for k, v in ref.items() if k != "name"}, f"logging.trackers[{i}]")
        trackers.append(entry.obj(params, run_dir.path, as_container(cfg)))
    return trackers


def _sampling_params(cfg: DictConfig, tokenizer: Any) -> dict[str, Any]:
    r = cfg.rollout
    return {
        "temperature": r.temperature,
        "top_p": r.top_p,
        "top_k": r.top_k,
        "max_new_tokens": r.max_new_tokens,
        "stop_token_ids": [tokenizer.eos_token_id],
    }


def _pinned_cores(cfg: DictConfig) -> tuple[list[int] | None, list[list[int]] | None]:
    """Disaggregated on a local cluster: trainer and each engine on cores of their own.

    Colocated phases take turns on every core; a remote cluster (``placement.ray_address`` /
    ``RAY_ADDRESS``) places actors on other machines, so neither is pinned.
    """
    remote = cfg.placement.ray_address or os.environ.get("RAY_ADDRESS")
    if cfg.placement.mode != "disaggregated" or remote or not hasattr(os, "sched_getaffinity"):
        return None, None
    return split_cores(
        os.sched_getaffinity(0), cfg.placement.train_cpus, cfg.placement.rollout_cpus, cfg.rollout.num_engines
    )


@contextmanager
def build_run(cfg: DictConfig, registries: Registries, rollout: bool = True) -> Iterator[Run]:
    """Start every component for ``cfg``; close them all on exit, also after errors."""
    from transformers import AutoTokenizer

    cfg = cfg.copy()
    cfg.model.path = str(resolve_model_path(cfg.model.path))
    run_dir = RunDirectory.for_config(cfg)
    run_dir.write_config(cfg)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or cfg.model.path)
    start_ray(cfg.placement)
    plain = as_container(cfg)
    train_cores, rollout_cores = _pinned_cores(cfg)
    train_threads = cfg.train.num_threads or (len(train_cores) if train_cores else 0)
    train_actor = spawn_engine(
        registries.engine.get(cfg.train.backend, "train.backend"), plain, cfg.placement.train_cpus, train_threads,
        "train", train_cores,
    )
    run = Run(cfg, registries, run_dir, tokenizer, train_actor, Objective.from_config(cfg.algorithm, registries))
    try:
        sources = build_sources(cfg, registries, tokenizer)
        run.sources = sources
        estimate = check_run_memory(cfg, sources, tokenizer)
        if estimate:
            print(estimate, flush=True)
        if rollout:
            engine_cls = registries.engine.get(cfg.rollout.backend, "rollout.backend")
            run.rollout_actors = [
                spawn_engine(engine_cls, plain, cfg.placement.rollout_cpus, cfg.rollout.num_threads, f"rollout{i}",
                             rollout_cores[i] if rollout_cores else None)
                for i in range(cfg.rollout.num_engines)
            ]
            urls = ray.get([a.call.remote("start") for a in run.rollout_actors])
            run.weight_sync = WeightSync(train_actor, run.rollout_actors, TransferConfig(**plain["transfer"]))
            clients = [EngineClient(url) for url in urls]
            run.agent_routers = AgentRouters(sources, clients, tokenizer, run_dir.path)
            for name, url in run.agent_routers.urls().items():
                print(f"agentflow router for data source {name!r}: {url}", flush=True)
            run.rollout = RolloutManager(
                {name: s.runtime for name, s in sources.items()},
                clients,
                cfg.rollout.n_samples_per_prompt,
                _sampling_params(cfg, tokenizer),
            )
            mixer = DataMixer.from_sources(sources, cfg.trainer.seed, batch_size=cfg.rollout.prompts_per_step)
            run.scheduler = _build_scheduler(cfg, registries, mixer, run.rollout)
        run.memory = RunMemory.for_run(cfg, train_actor, run.rollout_actors)
        run.trackers = _trackers(cfg, registries, run_dir)
        yield run
    finally:
        run.close()
