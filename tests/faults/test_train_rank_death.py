"""A train rank that dies: the last checkpoint stays intact, the resume command is printed, and
``trainer.auto_resume`` starts the run again from it.

Real processes: the CLI in a subprocess with its own Ray cluster, the tiny recipe with a
checkpoint every 2 steps and no step snapshot; the test SIGKILLs the train actor's process once 3 steps are
recorded. With ``trainer.auto_resume=1`` the same command goes on from the last checkpoint
to the last step and exits 0; the metrics hold every step once (the steps after the
checkpoint are trained again and their first rows dropped).
"""

from __future__ import annotations

import os
import re
import signal

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.serial]

STEPS = 6


def test_dead_train_rank_prints_the_resume_command_and_auto_resume_finishes_the_run(tmp_path, runs, watched,
                                                                                   leftovers):
    run_dir = tmp_path / "run"
    run = watched(run_dir, f"trainer.steps={STEPS}", "checkpoint.interval=2", "trainer.sft.steps=0",
                  "rollout.prompts_per_step=4", "rollout.n_samples_per_prompt=2", "rollout.max_new_tokens=12",
                  "trainer.auto_resume=1",
                  "checkpoint.snapshot=false")  # the checkpoint path; the step snapshot's is test_engine_death_default_layout
    proc = run.proc
    runs.wait_for(lambda: len(runs.metrics(run_dir)) >= 3, timeout=600, proc=proc)
    saved = runs.latest_step(run_dir)
    os.kill(run.actor_pids()["train"], signal.SIGKILL)
    proc.wait(timeout=600)
    text = run.text
    assert proc.returncode == 0, text[-4000:]
    assert "train actor 'train' died" in text
    latest = re.search(r"the train actor is gone with its state since the latest checkpoint; "
                       r"the latest checkpoint is step_(\d+): resume with trainer.resume=true "
                       rf"trainer.run_dir={re.escape(str(run_dir))}", text)
    assert latest and int(latest.group(1)) >= max(saved, 1), text[-4000:]
    assert "trainer.auto_resume: resuming (0 more allowed)" in text
    assert f"continuing at step {int(latest.group(1)) + 1}" in text
    steps = [row["step"] for row in runs.metrics(run_dir)]
    assert steps == list(range(STEPS))
    assert runs.latest_step(run_dir) == STEPS - 1 and (run_dir / "final_model").is_dir()
    assert leftovers(proc.pid) == []
