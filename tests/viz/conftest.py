"""Fixture ``tiny_run``: one real, shrunk ``tiny/tool_calculator`` training run (AgentFlow
router, bubblewrap calculator, warm start, two GRPO steps) with the tensorboard tracker on,
trained once per session through the real CLI; the plot, viewer and tracker tests read its
run directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

OVERRIDES = ["trainer.steps=2", "trainer.sft.steps=10", "trainer.sft.batch_size=8", "trainer.sft.examples=64",
             "rollout.prompts_per_step=2", "rollout.n_samples_per_prompt=2", "checkpoint.interval=0",
             "trainer.eval_interval=1", "trainer.eval_prompts=4", "logging.progress_bar=false",
             "logging.trackers=[console,jsonl,tensorboard]"]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (the tool recipe's sandbox; .ci/run installs it)")
    run_dir = tmp_path_factory.mktemp("viz") / "tiny_tool_run"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "OMP_WAIT_POLICY": "PASSIVE"}
    env.pop("RAY_ADDRESS", None)
    result = subprocess.run([sys.executable, "-m", "loongsage.cli", "train", "--config-name", "tiny/tool_calculator",
                             f"trainer.run_dir={run_dir}", *OVERRIDES],
                            capture_output=True, text=True, env=env, timeout=900)
    if result.returncode != 0:
        pytest.fail(f"loongsage train failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return run_dir
