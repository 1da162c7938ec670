"""The black-box agent recipe end to end (``tiny/code_repair_mini``, shrunk): two GRPO steps
whose rollouts are the real, unmodified mini-swe-agent (``mini``, its own venv in the
LoongSage cache, installed by ``ensure_mini_swe_agent`` when CI's ``.ci/run`` has not) repairing
``code_repair`` tasks in their work dirs against the run's router over the embedded engine,
scored by ``code_exec`` on the ``solution.py`` mini left, in a fresh bubblewrap sandbox.

The random tiny model never calls mini's bash tool, so every task fails; what must not fail
is the pipeline: every group yields samples, every sample is its persisted trajectory's
segment token for token (root and the forks mini's dropped replies make), rollout logprobs
equal the trainer's, and each reward is code_exec's verdict on the untouched buggy file,
checked here by running the same reward on that file. That a repaired file scores 1 through
the same path is tested in tests/agents/test_command.py (a program that writes the fix)."""

from __future__ import annotations

import asyncio
import shutil

import pytest

pytestmark = pytest.mark.slow

PROMPTS, SAMPLES, STEPS = 2, 2, 2


def buggy_file_passes(prompt_indices: set[int], seed: int) -> dict[int, dict]:
    """code_exec's result on each task's buggy ``solution.py`` (the tiny model never edits it)."""
    from loongsage.data.sources import SandboxFactory
    from loongsage.plugins import get_registries

    from loongsage_agents.agents.task_files import submission
    from loongsage_agents.datasets.code_repair import CodeRepairDataset
    from loongsage_agents.datasets.params import CodeRepairParams
    from loongsage_agents.rewards.code_exec import code_exec_reward_async

    data = CodeRepairDataset(CodeRepairParams(size=256, split="train"), seed=seed)
    factory = SandboxFactory(get_registries().resolve("sandbox", {"type": "bwrap"}, "sandbox", "type"))

    async def score(index: int) -> dict:
        prompt = data.get(index)
        return await code_exec_reward_async(submission(prompt.metadata["files"]["solution.py"]),
                                            prompt.ground_truth, {"exec_timeout_s": 10}, sandbox=factory)

    return {i: asyncio.run(score(i)) for i in sorted(prompt_indices)}


def test_mini_swe_agent_trains_on_code_repair_through_the_router(tmp_path, runs):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (the reward's sandbox)")
    from loongsage_agents.launchers.cli import ensure_mini_swe_agent

    ensure_mini_swe_agent()
    run_dir = tmp_path / "mini"
    runs.train(run_dir, f"trainer.steps={STEPS}", f"rollout.prompts_per_step={PROMPTS}",
               f"rollout.n_samples_per_prompt={SAMPLES}", "logging.samples_per_step=64",
               config="tiny/code_repair_mini", timeout=600)
    rows = runs.metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(STEPS))
    for row in rows:
        assert row["train/is_approx_k3_kl"] < 1e-6  # rollout logprobs are the trainer's
        assert row["rollout/failed_trajectories"] == 0
    # every trajectory finished with sampled tokens (no warm start: from version 0 on)
    trajectories, rewards = runs.finished_trajectories(run_dir, "code_repair", min_version=0)
    assert len(trajectories) == STEPS * PROMPTS * SAMPLES
    saved = [s for step in range(STEPS)
             for s in runs.check_samples_are_trajectories(run_dir, step, trajectories, rewards)]
    # every group of every step trained samples of all its trajectories
    by_prompt: dict[tuple[int, int], set[str]] = {}
    for sample in saved:
        by_prompt.setdefault((sample["step"], sample["prompt_index"]), set()).add(
            sample["reward_info"]["trajectory_id"])
    assert len(by_prompt) == STEPS * PROMPTS
    assert all(len(tids) == SAMPLES for tids in by_prompt.values())
    origins = {g["origin"] for traj in trajectories for g in traj["segments"]}
    assert origins == {"root", "compact"}  # each dropped reply forked the trajectory
    # the rewards: code_exec on the submitted solution.py, i.e. on the untouched buggy file
    expected = buggy_file_passes({s["prompt_index"] for s in saved}, seed=0)
    for sample in saved:
        info = sample["reward_info"]
        assert info["mini_exit_status"] in ("RepeatedFormatError", "LimitsExceeded"), info["stderr"][-2000:]
        assert info["exit_code"] == 0 and info.get("submit_error") is None
        verdict = expected[sample["prompt_index"]]
        assert (info["has_code"], info["passed"], info["total"]) == (True, verdict["passed"], verdict["total"])
        assert sample["reward"] == verdict["score"] == 0.0
        assert info["total"] > info["passed"]  # the bug fails a hidden test
