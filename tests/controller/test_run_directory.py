"""A run directory belongs to one run (``RunDirectory.claimed``).

Before, a fresh run in a finished run's directory trained, then deleted its own new
checkpoints as "older" than the old run's (``keep_last``), left ``latest`` dangling and ended
in ``FileNotFoundError`` with its weights lost, its metrics mixed into the old run's
``metrics.jsonl``; two runs started in one directory at once both exited 0 with interleaved
metrics. Now both are refused before anything starts, naming the ways out.

The second live run is a real other process holding the directory; it is SIGKILLed to show
the lock dies with it. The CLI test runs the real ``loongsage train`` (it stops before Ray).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from loongsage.controller.run_dir import RUN_ENTRIES, RunDirectory
from loongsage.errors import ConfigError

HOLDER = r'''
import sys, time
from pathlib import Path
from loongsage.controller.run_dir import RunDirectory
with RunDirectory(Path(sys.argv[1])).claimed(resume=False, overwrite=False):
    print("holding", flush=True)
    time.sleep(600)
'''


def finished_run(path):
    """What a finished run leaves: checkpoints, metrics, samples; and a file of the user's."""
    run_dir = RunDirectory(path)
    for step in (3, 4):
        (run_dir.checkpoints / f"step_{step:06d}").mkdir(parents=True)
    (run_dir.checkpoints / "latest").write_text("step_000004")
    (path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    run_dir.samples.mkdir()
    (run_dir.samples / "step_000004.jsonl").write_text("{}\n")
    (path / "notes.txt").write_text("mine")
    return run_dir


def test_a_fresh_run_in_another_run_s_directory_is_refused_with_the_ways_out(tmp_path):
    run_dir = finished_run(tmp_path / "run")
    with pytest.raises(ConfigError) as err:
        with run_dir.claimed(resume=False, overwrite=False):
            pass
    assert str(err.value) == (
        f"trainer.run_dir: {run_dir.path} holds another run (checkpoints step_000003, step_000004; "
        "metrics.jsonl with 2 rows); a fresh run there would mix its metrics with that run's and lose "
        "checkpoints to keep_last. Resume it (trainer.resume=true), start in a new directory (another "
        "trainer.run_dir, or none for a new timestamped one), or delete that run's files (trainer.overwrite=true)")
    assert (run_dir.checkpoints / "step_000004").is_dir()  # nothing touched
    with run_dir.claimed(resume=True, overwrite=False):  # resuming it is the point
        pass


def test_metrics_alone_make_a_directory_another_run_s(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(ConfigError, match=r"holds another run \(metrics.jsonl with 1 rows\)"):
        with RunDirectory(tmp_path).claimed(resume=False, overwrite=False):
            pass


def test_overwrite_deletes_the_previous_run_s_files_and_nothing_else(tmp_path):
    run_dir = finished_run(tmp_path / "run")
    with run_dir.claimed(resume=False, overwrite=True):
        left = sorted(p.name for p in run_dir.path.iterdir())
    assert left == [".lock", "checkpoints", "notes.txt", "samples"]
    assert list(run_dir.checkpoints.iterdir()) == [] and list(run_dir.samples.iterdir()) == []
    assert {"checkpoints", "metrics.jsonl", "samples"} <= set(RUN_ENTRIES)


def test_an_empty_or_new_directory_is_claimed(tmp_path):
    run_dir = RunDirectory(tmp_path / "new")
    run_dir.checkpoints.mkdir(parents=True)
    (run_dir.path / "metrics.jsonl").write_text("")  # a run that ended before its first step
    with run_dir.claimed(resume=False, overwrite=False) as claimed:
        assert claimed is run_dir
        assert (run_dir.path / ".lock").read_text() == str(os.getpid())
    with run_dir.claimed(resume=False, overwrite=False):  # released on exit
        pass


def test_a_second_live_run_is_refused_and_a_killed_one_leaves_nothing_stuck(tmp_path):
    run_dir = RunDirectory(tmp_path / "run")
    run_dir.checkpoints.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir.path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(ConfigError) as err:
            with run_dir.claimed(resume=True, overwrite=False):
                pass
        assert str(err.value) == (f"trainer.run_dir: {run_dir.path} is in use by another live run (pid "
                                  f"{holder.pid}); wait for it to end, or give this run another trainer.run_dir")
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
    start = time.monotonic()
    with run_dir.claimed(resume=True, overwrite=False):  # the kernel dropped the dead run's lock
        assert time.monotonic() - start < 1.0


def test_resume_and_overwrite_together_are_refused_at_validation():
    from omegaconf import OmegaConf

    from loongsage.config.validate import validate_config
    from loongsage.plugins import get_registries

    cfg = OmegaConf.create({"model": {"path": "unused"}, "trainer": {"resume": True, "overwrite": True},
                            "data_sources": [{"name": "p", "dataset": {"format": "synthetic_math", "size": 8},
                                              "reward": {"name": "math"}}]})
    with pytest.raises(ConfigError, match=r"^trainer.overwrite: deletes the previous run's files, which "
                       r"trainer.resume=true resumes from; set one of them$"):
        validate_config(cfg, get_registries())


def test_the_cli_refuses_a_fresh_run_in_a_finished_run_s_directory_before_anything_starts(tmp_path):
    run_dir = finished_run(tmp_path / "run")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    result = subprocess.run([sys.executable, "-m", "loongsage.cli", "train", "--config-name", "tiny/grpo",
                             f"trainer.run_dir={run_dir.path}"], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "holds another run (checkpoints step_000003, step_000004; metrics.jsonl with 2 rows)" in result.stderr
    assert "Started a local Ray instance" not in result.stderr + result.stdout
    assert (run_dir.path / "metrics.jsonl").read_text() == '{"step": 0}\n{"step": 1}\n'
