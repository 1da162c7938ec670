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
from warm_starts import cached

OVERRIDES = ["trainer.steps=2", "trainer.sft.steps=10", "trainer.sft.batch_size=8", "trainer.sft.examples=64",
             "rollout.prompts_per_step=2", "rollout.n_samples_per_prompt=2", "checkpoint.interval=0",
             "trainer.eval_interval=1", "trainer.eval_prompts=4", "logging.progress_bar=false",
             "logging.trackers=[console,jsonl,tensorboard]"]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """The run directory, trained once for the whole session: both xdist workers share it
    through the session's common temporary folder (tests/warm_starts.py's lock)."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (the tool recipe's sandbox; .ci/run installs it)")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "OMP_WAIT_POLICY": "PASSIVE"}
    env.pop("RAY_ADDRESS", None)

    def train(folder: Path) -> None:
        result = subprocess.run([sys.executable, "-m", "loongsage.cli", "train", "--config-name",
                                 "tiny/tool_calculator", f"trainer.run_dir={folder / 'tiny_tool_run'}", *OVERRIDES],
                                capture_output=True, text=True, env=env, timeout=900)
        if result.returncode != 0:
            pytest.fail(f"loongsage train failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                        f"{result.stderr[-3000:]}")

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the session's folder, above each worker's own
    return cached("viz-run", tuple(OVERRIDES), train, cache_root=shared) / "tiny_tool_run"
