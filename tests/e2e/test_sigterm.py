"""SIGTERM to a training run's driver, as ``docker stop`` and Kubernetes end a job: the step in
progress finishes and is checkpointed, the run exits with status 2 naming that checkpoint and
the resume command, and nothing of its process tree is left (that such a checkpoint resumes
is test_resume's). Real processes throughout: the CLI in a subprocess with its own Ray cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

STEPS = 8
OVERRIDES = (f"trainer.steps={STEPS}", "trainer.sft.steps=0", "rollout.prompts_per_step=4",
             "rollout.n_samples_per_prompt=2", "rollout.max_new_tokens=12", "logging.progress_bar=false")


def session_processes(sid: int) -> list[int]:
    """Live processes of session ``sid`` (a process's session is field 6 of /proc/PID/stat)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


def test_sigterm_checkpoints_the_step_in_progress_and_names_the_resume_command(tmp_path, runs):
    run_dir = tmp_path / "run"
    with open(tmp_path / "stderr", "w") as stderr:
        proc = subprocess.Popen([*runs.cli, "train", "--config-name", "tiny/grpo", f"trainer.run_dir={run_dir}", *OVERRIDES],
                                env=runs.env(), stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
        try:
            runs.wait_for(lambda: (run_dir / "metrics.jsonl").exists() and runs.metrics(run_dir), 600, proc)
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                runs.kill_group(proc)
    error = (tmp_path / "stderr").read_text()
    last = runs.metrics(run_dir)[-1]["step"]
    assert proc.returncode == 2, error[-3000:]
    assert last < STEPS - 1, "the signal must land before the run's last step"
    assert f"stopped by SIGTERM after step {last}, saved as checkpoint step_{last:06d}" in error, error[-3000:]
    assert f"resume with trainer.resume=true trainer.run_dir={run_dir}" in error
    assert runs.latest_step(run_dir) == last
    deadline = time.monotonic() + 30
    while session_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert session_processes(proc.pid) == [], "the stopped run left processes behind"
    assert [row["step"] for row in runs.metrics(run_dir)] == list(range(last + 1))
