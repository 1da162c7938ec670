"""``loongsage.train`` from Python with a reward given as a plain callable (no plugin package):
the callable is registered for that run through the plugin path, sent by value to the reward
worker processes (this test module, like a notebook, cannot be imported there), every data
source scores with it, and the returned metrics are the run's metrics.jsonl, whose reward is
the callable's.
The run is real (Ray actors, embedded engines) and ends with an exported model whose card
names the recipe and the metrics."""

from __future__ import annotations

import json

import pytest

import loongsage

pytestmark = pytest.mark.slow


def short_answers(text, ground_truth, params, **context):
    """1 for a response of at most 4 tokens, falling linearly to 0 at 16."""
    n = len(context["sample"].response_ids)
    source_is_arithmetic = context["prompt"].source == "arithmetic"
    return {"score": max(0.0, min(1.0, (16 - n) / 12)), "tokens": float(n),
            "arithmetic": float(source_is_arithmetic)}


def test_train_with_a_callable_reward_returns_the_run_and_its_metrics(tmp_path, monkeypatch):
    import ray

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    started = not ray.is_initialized()  # the run attaches to a cluster this test process already has
    result = loongsage.train("tiny/grpo", [f"trainer.run_dir={tmp_path / 'run'}", "trainer.steps=2",
                                           "trainer.sft.steps=2", "rollout.prompts_per_step=2",
                                           "rollout.n_samples_per_prompt=2", "rollout.max_new_tokens=16",
                                           "logging.progress_bar=false"], reward=short_answers)
    if started:
        ray.shutdown()
    assert result.run_dir == (tmp_path / "run").resolve()
    lines = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert result.metrics == lines and [r["step"] for r in lines] == [0, 1]
    for row in lines:  # the callable's own numeric fields are logged like any reward's
        assert row["rollout/tokens_mean"] == pytest.approx(row["rollout/response_length_mean"])
        assert row["rollout/arithmetic_mean"] == 1.0 and row["rollout/num_samples"] == 4
    for path in sorted((result.run_dir / "samples").glob("step_*.jsonl")):
        for sample in map(json.loads, path.read_text().splitlines()):
            n = len(sample["response_ids"])
            assert sample["reward"] == pytest.approx(max(0.0, min(1.0, (16 - n) / 12)))
            assert sample["reward_info"]["tokens"] == n
    assert result.series("rollout/reward_mean") == [(r["step"], r["rollout/reward_mean"]) for r in lines]
    card = (result.run_dir / "final_model" / "README.md").read_text()
    assert "recipe `tiny/grpo`" in card and "data_sources.0.reward=short_answers" in card
    rewards = [r["rollout/reward_mean"] for r in lines]  # 2 steps: one each, no overlap
    assert "| metric | first step | last step |" in card
    assert f"| `rollout/reward_mean` | {rewards[0]:.4g} | {rewards[1]:.4g} |" in card
    from huggingface_hub import ModelCard

    assert {"loongsage", "ppo_clip", "grpo"} <= set(ModelCard.load(result.run_dir / "final_model" / "README.md").data.tags)
    assert (result.run_dir / "final_model" / "config.json").is_file()
    assert not (result.run_dir / "final_model" / "train_state.pt").exists()
