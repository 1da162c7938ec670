"""Training on a verifiers environment through the ``environment`` plugin kind, end to end
(recipe ``tiny/verifiers_tools``, shrunk to two steps): the example environment adder-tools
(one MCP tool) run by verifiers' own env server (a real child process, its ``null`` harness a
real ``uv`` script in the ``subprocess`` runtime), the real router and the tiny model on the
embedded engine. Checks the wiring, not learning: every episode is one trajectory persisted
token-exactly and trained as it is; each reward is adder-tools' own scoring (``Task.score``)
of the episode's final reply, recomputed here from the trajectory's sampled tokens; and a
second source whose episodes fail half the time (a config-local plugin wrapping the adapter:
each second episode raises once verifiers returned it) has them marked, counted and given
reward 0 while the run goes on."""

from __future__ import annotations


import pytest

from tests.e2e.test_openenv import sampled_runs
from tests.environment_sources import flaky_plugin, library_reward

pytestmark = pytest.mark.slow


STEPS, PROMPTS, SAMPLES, TURNS = 2, 2, 2, 2  # one prompt per source per step


def test_verifiers_run_records_episodes_token_exactly_with_the_environments_rewards(
        tmp_path, runs, monkeypatch, tiny_model_dir):
    from transformers import AutoTokenizer

    plugin = flaky_plugin("flaky_verifiers", "verifiers_env:VerifiersEnvironment",
                          "verifiers_params:VerifiersParams", "flaky environment")
    (tmp_path / "flaky_verifiers_plugin.py").write_text(plugin)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    run_dir = tmp_path / "run"
    runs.train(run_dir, f"trainer.steps={STEPS}", f"rollout.prompts_per_step={PROMPTS}",
               f"rollout.n_samples_per_prompt={SAMPLES}", "rollout.max_new_tokens=16",
               "trainer.eval_interval=0", "checkpoint.interval=0", "plugins=[flaky_verifiers_plugin]",
               f"data_sources.0.environment.agent.max_turns={TURNS}",
               f"data_sources.1.environment.agent.max_turns={TURNS}",
               "data_sources.1.environment.type=flaky_verifiers", "data_sources.1.eval_only=false",
               "data_sources.1.name=flaky", config="tiny/verifiers_tools")
    rows = runs.metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(STEPS))
    for row in rows:  # the flaky source's group: one of its two episodes failed
        assert row["rollout/failed_trajectories"] == 1.0
        assert row["rollout/reward_errors"] == 0.0
        assert 1 <= row["rollout/turns_mean/adder"] <= TURNS
    trajectories, rewards = runs.finished_trajectories(run_dir, "adder", min_version=0)
    assert len(trajectories) == STEPS * SAMPLES  # one trajectory per episode
    flaky = runs.read_jsonl(run_dir / "trajectories" / "flaky" / "trajectories.jsonl")
    assert len(flaky) == STEPS * SAMPLES
    assert sorted(t["status"] for t in flaky) == ["failed"] * STEPS + ["finished"] * STEPS
    assert all("RuntimeError: flaky environment" in t["error"] for t in flaky if t["status"] == "failed")

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    by_id = {t["trajectory_id"]: t for t in trajectories}
    reward_of = {r["trajectory_id"]: r["reward"] for r in rewards}
    seen = set()
    for step in range(STEPS):
        samples = runs.read_jsonl(run_dir / "samples" / f"step_{step:06d}.jsonl")
        adder = [s for s in samples if s["source"] == "adder"]
        assert len(adder) == SAMPLES  # one sample per episode: its turns are one segment
        for sample in adder:  # the trained sample is its trajectory, token for token
            info = sample["reward_info"]
            seen.add(info["trajectory_id"])
            tokens, mask = runs.segment_tokens(by_id[info["trajectory_id"]], info["segment_id"])
            assert sample["prompt_ids"] + sample["response_ids"] == tokens
            assert [0] * len(sample["prompt_ids"]) + sample["loss_mask"] == mask
            data = sample["metadata"]["task_data"]
            text = tokenizer.decode(tokens)
            assert f"What is {data['a']} + {data['b']}?" in text and '"name": "add"' in text  # task, MCP tool
            replies = [tokenizer.decode(run, skip_special_tokens=True) for run in sampled_runs(tokens, mask)]
            assert len(replies) == info["episode_metrics"]["turns"] <= TURNS
            expected = library_reward(data, replies[-1].strip())  # the task's own scoring of its final reply
            assert sample["reward"] == expected == info["episode_reward"]
            assert info["episode_metrics"]["reward_correct"] == expected
            assert reward_of[info["trajectory_id"]] == sample["reward"]
        failed = [s for s in samples if s["source"] == "flaky" and s["reward_info"].get("failed")]
        assert len(failed) == 1 and failed[0]["reward"] == 0.0
    assert seen == set(by_id)
