"""Training through AgentFlow end to end (recipe ``tiny/tool_calculator``, shrunk): a warm
start on calculator demonstrations, then GRPO steps whose rollouts are ``tool_loop``
conversations (openai SDK -> the controller's router -> embedded engine, calculator in a
bubblewrap sandbox). Checks the wiring, not learning (the full recipe's numbers are in
docs/agents.md): every step logs the agent's tool use and the engines' prefix-cache hits, every trajectory is persisted to the
run directory token-exactly, and the trained samples are those trajectories."""

from __future__ import annotations

import re
import shutil

import pytest

pytestmark = pytest.mark.slow


def test_tool_loop_run_persists_trajectories_and_logs_tool_use(tmp_path, runs):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (the recipe's sandbox)")
    run_dir = tmp_path / "tool"
    result = runs.train(run_dir, "trainer.steps=2", "trainer.sft.steps=6", "trainer.sft.batch_size=4",
                        "trainer.sft.examples=64", "rollout.prompts_per_step=2",
                        "rollout.n_samples_per_prompt=2", "checkpoint.interval=0",
                        config="tiny/tool_calculator")
    first, last = map(float, re.search(r"sft warm start: loss ([0-9.]+) -> ([0-9.]+)", result.stdout).groups())
    assert last < first
    assert re.search(r"agentflow router for data source 'arithmetic': http://127\.0\.0\.1:\d+", result.stdout)
    rows = runs.metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1]
    for row in rows:
        assert 1.0 <= row["rollout/turns_mean"] <= 3.0
        assert 0.0 <= row["rollout/tool_calls_mean"] <= 3.0
        assert row["rollout/sampling_overridden_turns_mean"] == 0.0  # white-box: already rollout's
        assert row["train/is_approx_k3_kl"] < 1e-6  # the prefix cache (on by default) included
        # a group's samples share their prompt: in one prefill, or from the engine's prefix cache
        assert 0.0 < row["rollout/prefix_cache_hit_ratio"] < 1.0 and row["rollout/prefill_tokens"] > 0
    trajectories, rewards = runs.finished_trajectories(run_dir, "arithmetic")
    assert len(trajectories) == 2 * 2 * 2  # steps x prompts x samples
    runs.check_samples_are_trajectories(run_dir, 1, trajectories, rewards)
