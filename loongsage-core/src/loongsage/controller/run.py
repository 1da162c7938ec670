"""The training loop: generate -> score -> train (advantages, loss) -> sync weights.

Reads like slime's train.py on purpose: build the pieces, then loop. Scheduling (which
groups train in this step) sits behind the scheduler interface, so the asynchronous
runtime swaps in without touching this loop.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

from omegaconf import DictConfig

from loongsage.controller.batching import rollout_metrics
from loongsage.controller.failures import FailureGuard
from loongsage.controller.setup import Run, build_run
from loongsage.registry import Registries


@contextmanager
def timed(metrics: dict, key: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    metrics[key] = time.perf_counter() - start


def train_one_step(run: Run, step: int) -> dict[str, float]:
    metrics = run.evaluate() if run.eval_due(step) else {}
    colocated = run.cfg.placement.mode == "colocated"
    with timed(metrics, "timing/step"):
        with timed(metrics, "timing/rollout"):
            groups = run.scheduler.next_batch(step)
        batch, rewards, group_index = run.to_batch(groups, metrics)
        if colocated:  # the engines hand the cores to the trainer (partial: abort, resume later)
            run.scheduler.pause()
        with timed(metrics, "timing/train"):
            metrics.update(run.train(batch, rewards, group_index))
        if not colocated:  # generation overlapped training; stop it for the weight update
            run.scheduler.pause()
        with timed(metrics, "timing/weight_sync"):
            version = run.sync_weights()
        run.scheduler.on_weights_updated(version)
    metrics.update(rollout_metrics(groups))
    metrics.update(run.scheduler.metrics())
    run.record(step, metrics, groups)
    return metrics


def run_training(cfg: DictConfig, registries: Registries) -> str:
    """Train per ``cfg``; return the run directory."""
    with build_run(cfg, registries) as run:
        print(f"run directory: {run.run_dir.path}", flush=True)
        first_step = run.resume_or_warm_start()
        with FailureGuard(run) as guard:
            for step in run.progress(range(first_step, cfg.trainer.steps)):
                guard.begin(step)
                train_one_step(run, step)
                if run.checkpoint_due(step):
                    run.save_checkpoint(step)
        if run.eval_due(cfg.trainer.steps):
            run.record(cfg.trainer.steps, run.evaluate(), [])
        print(run.memory.summary_line(), flush=True)
        return str(run.run_dir.path)


def run_sft_only(cfg: DictConfig, registries: Registries) -> str:
    """Run only the supervised warm start and save the result."""
    with build_run(cfg, registries, rollout=False) as run:
        print(f"run directory: {run.run_dir.path}", flush=True)
        run.warm_start()
        folder = run.run_dir.path / "sft_model"
        run.save_model(str(folder))
        print(f"warm-started model: {folder} (use it as model.path)", flush=True)
        return str(folder)
