"""The tiny GRPO recipe with ``train.backend=megatron``: it learns, and a killed run resumes.

Real processes throughout (the CLI in a subprocess with its own Ray cluster, Megatron-Core
on CPU with gloo, real HTTP rollout engines, TransferMesh). The learning run trains on two
tensor-parallel ranks (``train.megatron.tp=2``: vocab-parallel LM head, both ranks sending
weights), the setting the embedded test's margin is asked of: mean reward of the last 5 steps
at least 0.1 above the first 5, training and inference agreeing token for token (k3 mismatch
below 1e-6 every step). The resume run is killed with SIGKILL after a checkpoint and resumed
from its Megatron distributed checkpoint (model shards + optimizer state); every step must
train the groups an uninterrupted run trains, and the HF export must load in transformers.
"""

from __future__ import annotations

import statistics

import pytest

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.slow

MEGATRON = ("train.backend=megatron", "placement.train_cpus=0.5", "placement.rollout_cpus=0.5")


def test_tiny_grpo_learns_with_megatron_tp2(tmp_path, runs):
    run_dir = tmp_path / "tiny"
    runs.train(run_dir, *MEGATRON, "train.megatron.tp=2")
    rows = runs.metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(20))
    for row in rows:
        assert row["train/is_approx_k3_kl"] < 1e-6
        assert row["perf/weight_sync_senders"] == 2
    rewards = [r["rollout/reward_mean"] for r in rows]
    first, last = statistics.mean(rewards[:5]), statistics.mean(rewards[-5:])
    assert last >= first + 0.1, f"reward did not rise: first 5 steps {first:.3f}, last 5 {last:.3f}"
    trainer = run_dir / "checkpoints" / "step_000019" / "trainer"
    assert (trainer / "megatron_optimizer" / "rank_1.pt").is_file()


STEPS = 5
RESUME = (*MEGATRON, f"trainer.steps={STEPS}", "checkpoint.interval=1", "checkpoint.keep_last=2",
          "trainer.sft.steps=0", "rollout.prompts_per_step=4", "rollout.n_samples_per_prompt=2",
          "rollout.max_new_tokens=12", "logging.samples_per_step=8")


def test_killed_megatron_run_resumes_from_its_distributed_checkpoint(tmp_path, runs):
    from transformers import AutoModelForCausalLM

    reference, crashed = tmp_path / "reference", tmp_path / "crashed"
    runs.train(reference, *RESUME)
    proc = runs.start_train(crashed, *RESUME)
    runs.wait_for(lambda: runs.latest_step(crashed) >= 1, timeout=600, proc=proc)
    runs.kill_group(proc)
    last = runs.latest_step(crashed)
    assert 1 <= last < STEPS - 1, "the kill must land before the run finished"

    resumed = runs.train(crashed, *RESUME, "trainer.resume=true")
    assert f"continuing at step {last + 1}" in resumed.stdout
    assert [row["step"] for row in runs.metrics(crashed)] == list(range(STEPS))
    for step in range(STEPS):
        assert runs.trained_prompts(crashed, step) == runs.trained_prompts(reference, step), step
    checkpoint = crashed / "checkpoints" / f"step_{STEPS - 1:06d}" / "trainer"
    assert (checkpoint / "megatron" / "layout.json").is_file()
    assert (checkpoint / "megatron_optimizer" / "rank_0.pt").is_file()
    assert AutoModelForCausalLM.from_pretrained(crashed / "final_model") is not None
