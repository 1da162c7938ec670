"""``tiny/grpo`` as shipped survives a SIGKILL of its rollout engine's process: every step, exit 0,
no finished step trained again.

The default layout is colocated with ``placement.share_process``: the engine lives in its
train rank's process, so no engine monitor runs and the kill takes the trainer's state with
it. The step snapshot (``controller/step_snapshot.py``) has kept the state after the last
finished step on disk; the failure promotes it to that step's checkpoint and
``trainer.auto_resume`` (on by default) continues from the step after it.

Real processes: the CLI in a subprocess with its own Ray cluster, the recipe's defaults for
the layout, health, checkpoints and auto-resume; only the sizes are small (no warm start,
4 prompts x 2 samples, 12 new tokens). The test SIGKILLs the process named for
``rollout0`` (the one that answers the engine's ``/health``) once a snapshot of step 2 or later
exists (a snapshot is replaced at every step: with the prefix cache a step of this size takes
about 0.4 s, shorter than the test's poll, so it waits for "2 or later" over 16 steps). Before the snapshot and the default auto-resume the run exited 2 with every step lost.
"""

from __future__ import annotations

import os
import re
import signal

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.serial]

STEPS = 16
SIZES = (f"trainer.steps={STEPS}", "trainer.sft.steps=0", "rollout.prompts_per_step=4",
         "rollout.n_samples_per_prompt=2", "rollout.max_new_tokens=12")


def snapshot_steps(run_dir) -> list[int]:
    """Steps of the complete step snapshots in ``run_dir`` (a snapshot is renamed into place whole)."""
    return sorted(int(p.name.rsplit("_", 1)[1]) for p in (run_dir / "checkpoints").glob(".snapshot_step_*"))


def test_engine_sigkill_in_the_default_layout_finishes_every_step_once(tmp_path, runs, watched, leftovers):
    run_dir = tmp_path / "run"
    run = watched(run_dir, *SIZES)
    proc = run.proc
    runs.wait_for(lambda: any(step >= 2 for step in snapshot_steps(run_dir)), timeout=600, proc=proc)
    pids = run.actor_pids()
    assert pids["rollout0"] == pids["train"], "the default layout hosts the engine in the train rank's process"
    os.kill(pids["rollout0"], signal.SIGKILL)
    snapshot = max(snapshot_steps(run_dir))
    before = {row["step"]: row for row in runs.metrics(run_dir)}
    assert snapshot < STEPS - 2 and runs.latest_step(run_dir) < 0, "the kill must land before any checkpoint"
    proc.wait(timeout=600)
    text = run.text
    assert proc.returncode == 0, text[-4000:]
    assert re.search(rf"step {snapshot + 1} failed: .*train actor 'train' died", text), text[-4000:]
    assert (f"the train actor is gone; its state after step {snapshot} (the step snapshot) saved as checkpoint "
            f"step_{snapshot:06d}: resume with trainer.resume=true trainer.run_dir={run_dir}") in text
    assert "trainer.auto_resume: resuming (2 more allowed)" in text
    assert f"continuing at step {snapshot + 1}" in text
    rows = runs.metrics(run_dir)
    assert [row["step"] for row in rows] == list(range(STEPS))
    # the steps the snapshot held were not trained again: their rows are the ones written before the kill
    assert [rows[step] for step in range(snapshot + 1)] == [before[step] for step in range(snapshot + 1)]
    assert rows[-1]["train/weight_version"] == STEPS  # one weight version per step, none trained twice
    assert runs.latest_step(run_dir) == STEPS - 1 and (run_dir / "final_model").is_dir()
    assert snapshot_steps(run_dir) == [], "the last snapshot is removed at the end"
    assert re.search(r"step snapshots: \d+ saved, [\d.]+ s each", text)
    assert leftovers(proc.pid) == []
