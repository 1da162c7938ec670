"""Training through AgentFlow end to end (recipe ``tiny/tool_calculator``, shrunk): a warm
start on calculator demonstrations, then GRPO steps whose rollouts are ``tool_loop``
conversations (openai SDK -> the controller's router -> embedded engine, calculator in a
bubblewrap sandbox). Checks the wiring, not learning (the full recipe's numbers are in
docs/agents.md): every step logs the agent's tool use, every trajectory is persisted to the
run directory token-exactly, and the trained samples are those trajectories."""

from __future__ import annotations

import json
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
        assert row["train/is_approx_k3_kl"] < 1e-6
    lines = (run_dir / "trajectories" / "arithmetic" / "trajectories.jsonl").read_text().splitlines()
    trajectories = [json.loads(line) for line in lines]
    assert len(trajectories) == 2 * 2 * 2  # steps x prompts x samples
    for traj in trajectories:
        assert traj["status"] == "finished"
        n = len(traj["tokens"])
        assert len(traj["loss_mask"]) == len(traj["logprobs"]) == len(traj["versions"]) == n
        sampled = [i for i, m in enumerate(traj["loss_mask"]) if m]
        assert sampled and all(traj["versions"][i] >= 1 for i in sampled)  # after the warm start
    rewards = [json.loads(line) for line in
               (run_dir / "trajectories" / "arithmetic" / "rewards.jsonl").read_text().splitlines()]
    assert sorted(r["trajectory_id"] for r in rewards) == sorted(t["trajectory_id"] for t in trajectories)
    saved = [json.loads(line) for line in (run_dir / "samples" / "step_000001.jsonl").read_text().splitlines()]
    by_id = {t["trajectory_id"]: t for t in trajectories}
    for sample in saved:
        info = sample["reward_info"]
        traj = by_id[info["trajectory_id"]]
        [segment] = [g for g in traj["segments"] if g["segment_id"] == info["segment_id"]]
        tokens = [traj["tokens"][i] for start, end in segment["spans"] for i in range(start, end)]
        assert sample["prompt_ids"] + sample["response_ids"] == tokens
        [reward] = [r for r in rewards if r["trajectory_id"] == info["trajectory_id"]]
        assert reward["reward"] == sample["reward"]
