"""Training on reasoning-gym tasks through the ``environment`` plugin kind, end to end (recipe
``tiny/reasoning_gym``, shrunk to two steps): the real library's tasks, the real router and the
tiny model on the embedded engine. Checks the wiring, not learning: every episode is one
trajectory persisted token-exactly and trained as it is, each reward is the task's own
``score_answer`` of the reply (recomputed here from the trajectory's tokens with the library),
and a second source whose episodes fail half the time (a config-local plugin wrapping the
adapter: each second episode raises after its model call) has them marked, counted and given
reward 0 while the run goes on."""

from __future__ import annotations


import pytest

from tests.environment_sources import flaky_plugin

pytestmark = pytest.mark.slow


STEPS, PROMPTS, SAMPLES = 2, 2, 2  # one prompt per source per step
TASKS = {"basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
         "leg_counting": {}, "letter_counting": {}}  # as the recipe configures them


def last_line_or_tag(text: str) -> str | None:
    """The answer a reply gives, as the recipe's system prompt asks for it: inside
    <answer></answer> (reasoning-gym's own extractor), else the last non-empty line."""
    from reasoning_gym.utils import extract_answer

    tagged = extract_answer(text)
    if tagged is not None:
        return tagged
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def test_reasoning_gym_run_records_episodes_token_exactly_with_the_tasks_own_rewards(
        tmp_path, runs, monkeypatch, tiny_model_dir):
    import reasoning_gym
    from transformers import AutoTokenizer

    plugin = flaky_plugin("flaky_gym", "reasoning_gym_env:ReasoningGymEnvironment",
                          "params:ReasoningGymParams", "flaky scorer")
    (tmp_path / "flaky_gym_plugin.py").write_text(plugin)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    run_dir = tmp_path / "run"
    result = runs.train(run_dir, f"trainer.steps={STEPS}", "trainer.sft.steps=4", "trainer.sft.batch_size=4",
                        "trainer.sft.examples=32", f"rollout.prompts_per_step={PROMPTS}",
                        f"rollout.n_samples_per_prompt={SAMPLES}", "rollout.max_new_tokens=16",
                        "trainer.eval_interval=0", "checkpoint.interval=0", "plugins=[flaky_gym_plugin]",
                        "data_sources.1.environment.type=flaky_gym", "data_sources.1.eval_only=false",
                        "data_sources.1.name=flaky", config="tiny/reasoning_gym")
    assert ("data: reasoning_gym (environment reasoning_gym, 1,000 prompts, weight 1); "
            "flaky (environment flaky_gym, 1,000 prompts, weight 1)") in result.stdout
    card = (run_dir / "final_model" / "README.md").read_text()
    assert "`reasoning_gym` (environment `reasoning_gym`), `flaky` (environment `flaky_gym`)" in card
    rows = runs.metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(STEPS))
    for row in rows:  # the flaky source's group: one of its two episodes failed
        assert row["rollout/failed_trajectories"] == 1.0
        assert row["rollout/reward_errors"] == 0.0
        assert 0.0 <= row["rollout/correct_mean/reasoning_gym"] <= 1.0
    trajectories, rewards = runs.finished_trajectories(run_dir, "reasoning_gym")
    assert len(trajectories) == STEPS * SAMPLES  # one trajectory per episode
    flaky = runs.read_jsonl(run_dir / "trajectories" / "flaky" / "trajectories.jsonl")
    assert len(flaky) == STEPS * SAMPLES
    assert sorted(t["status"] for t in flaky) == ["failed"] * STEPS + ["finished"] * STEPS
    assert all("RuntimeError: flaky scorer" in t["error"] for t in flaky if t["status"] == "failed")

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    by_id = {t["trajectory_id"]: t for t in trajectories}
    reward_of = {r["trajectory_id"]: r["reward"] for r in rewards}
    checked = 0
    for step in range(STEPS):
        samples = runs.read_jsonl(run_dir / "samples" / f"step_{step:06d}.jsonl")
        gym = [s for s in samples if s["source"] == "reasoning_gym"]
        assert len(gym) == SAMPLES
        for sample in gym:  # the trained sample is its trajectory, token for token
            info = sample["reward_info"]
            tokens, mask = runs.segment_tokens(by_id[info["trajectory_id"]], info["segment_id"])
            assert sample["prompt_ids"] + sample["response_ids"] == tokens
            assert [0] * len(sample["prompt_ids"]) + sample["loss_mask"] == mask
            meta = sample["metadata"]
            dataset = reasoning_gym.create_dataset(meta["task"], seed=0, size=meta["task_index"] + 1,
                                                   **TASKS[meta["task"]])
            entry = dataset[meta["task_index"]]
            assert entry["question"] in tokenizer.decode(sample["prompt_ids"])
            sampled = [t for t, m in zip(sample["response_ids"], sample["loss_mask"]) if m]
            reply = tokenizer.decode(sampled, skip_special_tokens=True)
            assert info["extracted_answer"] == last_line_or_tag(reply)  # the episode saw these tokens
            expected = dataset.score_answer(last_line_or_tag(reply), entry)
            assert sample["reward"] == pytest.approx(expected) == info["episode_reward"]
            assert reward_of[info["trajectory_id"]] == sample["reward"]
            checked += 1
        failed = [s for s in samples if s["source"] == "flaky" and s["reward_info"].get("failed")]
        assert len(failed) == 1 and failed[0]["reward"] == 0.0
    assert checked == STEPS * SAMPLES
