"""SIGTERM or SIGINT to a training run, to its driver or to the driver's whole process group (as
``docker stop`` and Kubernetes, ``timeout``, a batch scheduler's time limit and a terminal's
Ctrl-C send them): the step in progress finishes and is checkpointed, the run exits with status 2
naming the signal, that checkpoint and the resume command, without a traceback, and nothing of
the run is left (that such a checkpoint resumes is test_resume's). A SIGKILL of the driver
leaves no process of the run after 10 s. Real processes throughout: the CLI in a subprocess with
its own Ray cluster; every process of the run carries a marker in its environment (Ray's daemons
run in sessions of their own, so the driver's session no longer holds them all). Before Ray's
daemons left the driver's group, a group SIGTERM killed GCS and raylet under the running step and
a group SIGINT ended the run with a traceback and exit 1; after a driver SIGKILL Ray's agents
lived about a minute. A run that ends normally cuts its own teardown short (Ray's autoscaler
monitor SIGKILLed rather than waited on, the interpreter's last garbage collection skipped): it
exits 0 with every file of the run complete and, again, nothing of the run left."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from loongsage.controller.ray_sessions import processes_marked

pytestmark = pytest.mark.slow

STEPS = 8
OVERRIDES = ("trainer.sft.steps=0", "rollout.prompts_per_step=4",
             "rollout.n_samples_per_prompt=2", "rollout.max_new_tokens=12", "logging.progress_bar=false")
MARKER = "LOONGSAGE_TEST_RUN"


def gone_within(mark: str, timeout: float) -> tuple[list[int], float]:
    """Wait up to ``timeout`` s for every process marked ``mark`` to end; those left and the seconds waited."""
    start = time.monotonic()
    while processes_marked(MARKER, mark) and time.monotonic() - start < timeout:
        time.sleep(0.2)
    return processes_marked(MARKER, mark), time.monotonic() - start


def start_marked(runs, run_dir: Path, stderr, steps: int = STEPS) -> tuple[subprocess.Popen, str]:
    """``loongsage train`` for ``steps`` steps in a process group (and session) of its own, its processes marked."""
    mark = uuid.uuid4().hex
    proc = subprocess.Popen([*runs.cli, "train", "--config-name", "tiny/grpo", f"trainer.run_dir={run_dir}", *OVERRIDES,
                             f"trainer.steps={steps}"],
                            env={**runs.env(), MARKER: mark}, stdout=subprocess.DEVNULL, stderr=stderr,
                            start_new_session=True)
    return proc, mark


SENDS = {"driver": os.kill, "group": os.killpg}  # the driver's pid is its group's id (start_new_session)


@pytest.mark.parametrize("target, signum", [("driver", signal.SIGTERM), ("group", signal.SIGTERM),
                                            ("group", signal.SIGINT)])
def test_a_stop_signal_checkpoints_the_step_in_progress_and_names_the_resume_command(tmp_path, runs, target, signum):
    run_dir = tmp_path / "run"
    name = signal.Signals(signum).name
    with open(tmp_path / "stderr", "w") as stderr:
        proc, mark = start_marked(runs, run_dir, stderr)
        try:
            runs.wait_for(lambda: (run_dir / "metrics.jsonl").exists() and runs.metrics(run_dir), 600, proc)
            SENDS[target](proc.pid, signum)
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                runs.kill_group(proc)
    error = (tmp_path / "stderr").read_text()
    last = runs.metrics(run_dir)[-1]["step"]
    assert proc.returncode == 2, error[-3000:]
    assert last < STEPS - 1, "the signal must land before the run's last step"
    assert f"stopped by {name} after step {last}, saved as checkpoint step_{last:06d}" in error, error[-3000:]
    assert f"resume with trainer.resume=true trainer.run_dir={run_dir}" in error
    assert "Traceback" not in error, error[-3000:]
    assert runs.latest_step(run_dir) == last
    left, _ = gone_within(mark, 30)
    assert left == [], "the stopped run left processes behind"
    assert [row["step"] for row in runs.metrics(run_dir)] == list(range(last + 1))


def test_after_a_sigkill_of_the_driver_no_process_of_the_run_is_left_within_10_s(tmp_path, runs):
    run_dir = tmp_path / "run"
    with open(tmp_path / "stderr", "w") as stderr:
        proc, mark = start_marked(runs, run_dir, stderr)
        try:
            runs.wait_for(lambda: (run_dir / "metrics.jsonl").exists() and runs.metrics(run_dir), 600, proc)
            started = processes_marked(MARKER, mark)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            left, seconds = gone_within(mark, 10)
        finally:
            if proc.poll() is None:
                runs.kill_group(proc)
            for pid in processes_marked(MARKER, mark):  # whatever the assertion below reports, not left running
                os.kill(pid, signal.SIGKILL)
    print(f"{len(started)} processes of the run; all gone {seconds:.1f} s after the driver's SIGKILL")
    assert len(started) >= 5, "the run's processes (driver, GCS, raylet, agents, actors) carry the marker"
    assert left == [], f"left after 10 s: {left}"


def test_a_ctrl_c_before_the_run_started_stops_at_once_in_one_line(tmp_path, runs):
    """Nothing finished yet, so nothing to save: one line and exit 130, no traceback, no process left."""
    run_dir = tmp_path / "run"
    with open(tmp_path / "stderr", "w") as stderr:
        proc, mark = start_marked(runs, run_dir, stderr)
        try:
            runs.wait_for(lambda: "Started a local Ray instance" in (tmp_path / "stderr").read_text(), 300, proc)
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                runs.kill_group(proc)
    error = (tmp_path / "stderr").read_text()
    assert proc.returncode == 130, error[-3000:]
    assert "interrupted: stopped at once, before the run could save a step" in error, error[-3000:]
    assert "Traceback" not in error, error[-3000:]
    assert gone_within(mark, 30)[0] == []


def test_a_run_that_ends_normally_exits_0_with_its_files_complete_and_nothing_left(tmp_path, runs):
    from safetensors.torch import load_file

    run_dir = tmp_path / "run"
    with open(tmp_path / "stderr", "w") as stderr:
        proc, mark = start_marked(runs, run_dir, stderr, steps=2)
        try:
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                runs.kill_group(proc)
    error = (tmp_path / "stderr").read_text()
    assert proc.returncode == 0, error[-3000:]
    assert "Traceback" not in error and "autoscaler" not in error.lower(), error[-3000:]
    assert [row["step"] for row in runs.metrics(run_dir)] == [0, 1]
    assert [len(runs.read_jsonl(run_dir / "samples" / f"step_{step:06d}.jsonl")) for step in (0, 1)] == [8, 8]
    weights = load_file(run_dir / "final_model" / "model.safetensors")
    assert weights and all(tensor.isfinite().all() for tensor in weights.values())
    assert (run_dir / "final_model" / "README.md").read_text().strip()
    left, _ = gone_within(mark, 10)
    assert left == [], f"the finished run left processes behind: {left}"
