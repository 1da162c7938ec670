"""A run's lifecycle around the loop: warm start, model export, checkpoints, resume.

A checkpoint is the trainer's state (weights, optimizer, RNG), the state of each step term
that keeps one (``save_state``/``load_state``: a value model's weights and optimizer), plus
the controller's (step, weight version, the scheduler's state with its data order); ``resume_or_warm_start`` either
restores the newest intact one (its manifest verified by ``build_run``, falling back past
damaged ones) and republishes its weights, or runs the supervised warm start of a fresh run.
"""

from __future__ import annotations

import logging
from pathlib import Path

import ray

from loongsage.controller.sft import describe_warm_start, sft_examples, sft_progress, train_sft
from loongsage.controller.verbs import Run
from loongsage.data.sources import training_sources

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 10.0  # how often a long warm start reports its step and loss


def warm_start(run: Run) -> None:
    """Supervised warm start on the data sources' demonstrations (``trainer.sft``)."""
    sft = run.cfg.trainer.sft
    if sft.steps <= 0:
        return
    parser = run.spec.tool_parser.obj()
    seed = run.cfg.trainer.seed
    examples = sft_examples(training_sources(run.sources), sft.examples, seed=seed, parser=parser)
    log.info(describe_warm_start(examples, sft.steps))
    done = run.trainers.start(train_sft, examples, sft, seed)
    reported = 0  # a report only when a step finished since the last one (step 0 has no loss yet)
    while len(ray.wait(done, num_returns=len(done), timeout=PROGRESS_EVERY_S)[0]) < len(done):
        now = run.trainers.inspect(sft_progress)  # each rank's loss is its share of the step's
        if now[0]["step"] > reported:
            reported = now[0]["step"]
            log.info(f"sft warm start: step {reported}/{now[0]['steps']} loss {sum(r['loss'] for r in now):.3f}")
    losses = [sum(shares) for shares in zip(*ray.get(done))]
    peak = ""
    if run.memory is not None:
        peak = f" (train actor RSS peak {run.memory.step_metrics().get('perf/train_rss_peak_gb', 0.0):.2f} GB)"
    log.info(f"sft warm start: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {len(losses)} steps{peak}")
    run.extensions.warm_started(lambda: _save_warm_start_model(run))
    if run.rollout_actors:
        run.publish_weights()


def _save_warm_start_model(run: Run) -> Path:
    """``<run_dir>/warm_start_model``: the warm-started policy, for a step term's model to start from."""
    folder = run.run_dir.path / "warm_start_model"
    save_model(run, str(folder))
    return folder


def export_final_model(run: Run) -> Path:
    """``<run_dir>/final_model``: the newest checkpoint's model with a model card naming the
    recipe and the run's metrics (saved first if the run ended without a checkpoint)."""
    from loongsage.controller.model_card import model_card
    from loongsage.tracking.jsonl import read_metrics

    latest = run.run_dir.latest_checkpoint()
    if latest is None:
        save_checkpoint(run, max(run.cfg.trainer.steps - 1, 0))
        latest = run.run_dir.latest_checkpoint()
    rows = read_metrics(run.run_dir.path / "metrics.jsonl")
    card = model_card(run.cfg, run.spec.recipe, run.spec.overrides, rows)
    folder = run.run_dir.export_model(latest[0] / "trainer", card)
    log.info(f"final model: {folder} (model card: {folder / 'README.md'})")
    return folder


def save_model(run: Run, folder: str) -> None:
    """Save the trainer's weights and tokenizer as a Hugging Face folder (every rank takes part)."""
    run.trainers.call("save", folder)


def checkpoint_due(run: Run, step: int) -> bool:
    interval = run.cfg.checkpoint.interval
    last = step == run.cfg.trainer.steps - 1
    return last or (interval > 0 and (step + 1) % interval == 0)


def save_checkpoint(run: Run, step: int) -> None:
    """Checkpoint ``step`` (``RunDirectory.write_checkpoint``: verified by its manifest; a failed
    write names the file and why and keeps the previous checkpoint)."""
    run.run_dir.write_checkpoint(step, lambda folder: save_actor_state(run, folder), controller_state(run, step),
                                 run.cfg.checkpoint.keep_last)


def save_actor_state(run: Run, folder: Path) -> None:
    """The trainer's state (and the step terms') into ``folder``, as a checkpoint holds them."""
    run.trainers.call("save", str(folder / "trainer"))
    run.extensions.save_state(folder)


def controller_state(run: Run, step: int) -> dict:
    """What a checkpoint of ``step`` keeps of the controller: the step, the weight version and the
    scheduler's state with its data order."""
    return {
        "step": step,
        "version": run.version,
        "scheduler": run.scheduler.state_dict() if run.scheduler else None,
    }


def resume_or_warm_start(run: Run) -> int:
    """Restore the checkpoint ``build_run`` chose and verified when resuming (``Run.resume_from``:
    the newest intact one); otherwise warm start. Return the first step."""
    latest = run.resume_from
    if latest is None:
        warm_start(run)
        return 0
    folder, state = latest
    run.trainers.call("load", str(folder / "trainer"))
    run.extensions.load_state(folder)
    if run.scheduler and state["scheduler"] is not None:
        run.scheduler.load_state_dict(state["scheduler"])
    for tracker in run.trackers:
        if hasattr(tracker, "truncate_before"):
            tracker.truncate_before(state["step"] + 1)
    if run.rollout_actors:
        run.publish_weights(state["version"])
    else:
        run.version = state["version"]
    log.info(f"resumed from {folder.name}: continuing at step {state['step'] + 1}")
    return state["step"] + 1
