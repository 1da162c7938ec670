"""A rollout engine that dies mid-run without the engine monitor (``rollout.health.enable=false``;
with it the engine is restarted, tests/faults): the error names it, the trainer's state is
saved, resume works.

Real processes: the CLI in a subprocess with its own Ray cluster; the test SIGKILLs the
rollout engine's process (its pid is printed at start) after a few steps. The run must exit
with an error that says the rollout engine died (not just that /generate was unreachable),
leave a checkpoint of the last step the trainer finished although none was due, and resume
from it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading

import pytest

pytestmark = pytest.mark.slow

STEPS = 8
COMMON = (
    f"trainer.steps={STEPS}",
    "checkpoint.interval=0",
    "trainer.sft.steps=0",
    "rollout.prompts_per_step=4",
    "rollout.n_samples_per_prompt=2",
    "rollout.max_new_tokens=12",
    "rollout.health.enable=false",
    "placement.share_process=false",  # the engine an actor of its own, to die alone
    "trainer.auto_resume=0",  # stop with the resume command (the default resumes on its own)
)


def test_dead_rollout_engine_is_named_and_the_trainer_is_saved(tmp_path, runs):
    run_dir = tmp_path / "run"
    args = [*runs.cli, "train", "--config-name", "tiny/grpo", f"trainer.run_dir={run_dir}",
            "logging.progress_bar=false", *COMMON]
    proc = subprocess.Popen(args, env=runs.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        runs.wait_for(lambda: len(runs.metrics(run_dir)) >= 3, timeout=600, proc=proc)
        pids = dict(re.findall(r"(\w+) (\d+)", next(line for line in out if line.startswith("actor processes:"))))
        os.kill(int(pids["rollout0"]), signal.SIGKILL)
        stderr = proc.communicate(timeout=300)[1]
    finally:
        if proc.poll() is None:
            runs.kill_group(proc)
    assert proc.returncode == 2, stderr[-3000:]
    error = stderr[stderr.index("error: step "):]
    failed_step = int(re.match(r"error: step (\d+) failed", error).group(1))
    assert "rollout engine 'rollout0' died (The actor is dead because" in error, error
    saved = runs.latest_step(run_dir)
    assert failed_step >= 3 and saved in (failed_step - 1, failed_step)
    assert f"trainer state through step {saved} saved as checkpoint step_{saved:06d}" in error

    resumed = runs.train(run_dir, *COMMON, "trainer.resume=true")
    assert f"continuing at step {saved + 1}" in resumed.stdout
    steps = [row["step"] for row in runs.metrics(run_dir)]
    assert steps == sorted(set(steps)) and set(range(3)) | set(range(saved + 1, STEPS)) <= set(steps)
