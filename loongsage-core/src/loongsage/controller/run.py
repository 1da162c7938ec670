"""The training loop: generate -> score -> train (advantages, loss) -> publish weights.

Reads like slime's train.py on purpose: build the pieces, then loop. Scheduling (which
groups train in this step) sits behind the scheduler interface, so the asynchronous
runtime swaps in without touching this loop; the verbs live in ``verbs.py``, the warm
start, checkpoints and resume in ``lifecycle.py``, the building in ``build.py``. A
SIGTERM or SIGINT ends the loop after a checkpoint of the step in progress (``stop_request.py``);
every other step leaves a step snapshot (``step_snapshot.py``) that an actor death resumes from.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from loongsage.config.validate import RunConfig
from loongsage.controller.batching import rollout_metrics
from loongsage.controller.build import build_run
from loongsage.controller.failures import FailureGuard, RunFailed
from loongsage.controller.lifecycle import (checkpoint_due, export_final_model, resume_or_warm_start, save_checkpoint,
                                            save_model, warm_start)
from loongsage.controller.stop_request import StopRequest
from loongsage.controller.verbs import Run, timed

log = logging.getLogger(__name__)


def train_one_step(run: Run, step: int) -> dict[str, float]:
    metrics = run.evaluate() if run.eval_due(step) else {}
    with timed(metrics, "timing/step"):
        with timed(metrics, "timing/rollout"):
            groups = run.scheduler.next_batch(step)
        run.phases.to_train()  # colocated: engines hand the devices over (partial: abort)
        with timed(metrics, "timing/train"):
            metrics.update(run.train(groups, step, metrics))
        run.phases.to_sync()  # disaggregated: generation overlapped training, stop it now
        with timed(metrics, "timing/weight_sync"):
            metrics.update(run.publish_weights())
        run.phases.to_rollout()
    metrics.update(rollout_metrics(groups))
    metrics.update(run.rollout.reward_metrics())
    metrics.update(run.scheduler.metrics())
    metrics.update(run.data_metrics())
    metrics.update(run.engine_metrics())
    run.record(step, metrics, groups)
    return metrics


def run_training(spec: RunConfig) -> str:
    """Train per ``spec``; return the run directory. A run that fails because an actor died
    and left a checkpoint starts again from it, up to ``trainer.auto_resume`` times, unless it
    was sent SIGTERM or SIGINT (a scheduler stopping every process of the job kills the actors too)."""
    restarts = spec.cfg.trainer.auto_resume
    with StopRequest().starting() as stop:
        while True:
            try:
                return _train(spec, stop)
            except RunFailed as err:
                if err.resume_dir is None or restarts <= 0 or stop.requested:
                    raise
                restarts -= 1
                log.warning(f"{err}\ntrainer.auto_resume: resuming ({restarts} more allowed)")
                spec = resuming(spec, err.resume_dir)


def resuming(spec: RunConfig, run_dir: Path) -> RunConfig:
    """``spec`` resuming the run in ``run_dir``."""
    cfg = spec.cfg.copy()
    cfg.trainer.resume = True
    cfg.trainer.run_dir = str(run_dir)
    return dataclasses.replace(spec, cfg=cfg)


def _train(spec: RunConfig, stop: StopRequest) -> str:
    with build_run(spec) as run, stop:  # the handler goes in after ray.init, which sets Ray's
        first_step = resume_or_warm_start(run)
        run.phases.to_rollout()
        with FailureGuard(run) as guard:
            for step in run.progress(range(first_step, run.cfg.trainer.steps)):
                guard.begin(step)
                train_one_step(run, step)
                stopping = stop.requested  # read once: a signal may land between two reads
                if checkpoint_due(run, step) or stopping:
                    save_checkpoint(run, step)
                else:
                    guard.keep(step)  # the step snapshot: an actor death loses only the step in flight
                if stopping:
                    raise stop.stopped(run.run_dir, step)
        if run.eval_due(run.cfg.trainer.steps):
            run.record(run.cfg.trainer.steps, run.evaluate(), [])
        log.info(run.memory.summary_line())
        export_final_model(run)
        return str(run.run_dir.path)


def run_sft_only(spec: RunConfig) -> str:
    """Run only the supervised warm start and save the result."""
    with build_run(spec, rollout=False) as run:
        warm_start(run)
        folder = run.run_dir.path / "sft_model"
        save_model(run, str(folder))
        log.info(f"warm-started model: {folder} (use it as model.path)")
        return str(folder)
