"""Training on an OpenEnv environment through the ``environment`` plugin kind, end to end (recipe
``tiny/openenv``, shrunk to two steps): the example environment number_guess served by a real
openenv-core server process the adapter starts, the real router and the tiny model on the
embedded engine. Checks the wiring, not learning: every episode is one multi-turn trajectory
persisted token-exactly and trained as it is; each episode's return is recomputed here by
replaying its replies (decoded from the trajectory's sampled tokens) on number_guess's own
environment class, with the invalid replies counted as the run counted them; and a second
source whose episodes fail half the time (a config-local plugin wrapping the adapter: each
second episode raises once its turns are done) has them marked, counted and given reward 0
while the run goes on."""

from __future__ import annotations


import pytest

from tests.environment_sources import flaky_plugin

pytestmark = pytest.mark.slow


STEPS, PROMPTS, SAMPLES, TURNS = 2, 2, 2, 2  # one prompt per source per step


def sampled_runs(tokens: list[int], mask: list[int]) -> list[list[int]]:
    """The sampled tokens of each model turn: the runs of the loss mask."""
    runs: list[list[int]] = []
    previous = 0
    for token, m in zip(tokens, mask):
        if m and not previous:
            runs.append([])
        if m:
            runs[-1].append(token)
        previous = m
    return runs


def replay(seed: int, replies: list[str]) -> tuple[list[float], int]:
    """number_guess's own step rewards for these replies, and how many were no valid action."""
    from number_guess.models import GuessAction
    from number_guess.server.environment import NumberGuessEnvironment
    from pydantic import ValidationError

    from loongsage_agents.environments.openenv_env import parse_action
    from loongsage_agents.environments.openenv_server import InvalidAction

    env = NumberGuessEnvironment()
    env.reset(seed=seed)
    rewards, invalid = [], 0
    for reply in replies:
        try:
            action = GuessAction(**parse_action(reply))
        except (InvalidAction, ValidationError):
            invalid += 1
            continue
        observation = env.step(action)
        rewards.append(observation.reward)
        if observation.done:
            break
    return rewards, invalid


def test_openenv_run_records_multi_turn_episodes_token_exactly_with_the_environments_returns(
        tmp_path, runs, monkeypatch, tiny_model_dir):
    from transformers import AutoTokenizer

    plugin = flaky_plugin("flaky_openenv", "openenv_env:OpenEnvEnvironment",
                          "openenv_params:OpenEnvParams", "flaky environment")
    (tmp_path / "flaky_openenv_plugin.py").write_text(plugin)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    run_dir = tmp_path / "run"
    runs.train(run_dir, f"trainer.steps={STEPS}", f"rollout.prompts_per_step={PROMPTS}",
               f"rollout.n_samples_per_prompt={SAMPLES}", "rollout.max_new_tokens=16",
               "trainer.eval_interval=0", "checkpoint.interval=0", "plugins=[flaky_openenv_plugin]",
               f"data_sources.0.environment.max_turns={TURNS}", f"data_sources.1.environment.max_turns={TURNS}",
               "data_sources.1.environment.type=flaky_openenv", "data_sources.1.eval_only=false",
               "data_sources.1.name=flaky", config="tiny/openenv")
    rows = runs.metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(STEPS))
    for row in rows:  # the flaky source's group: one of its two episodes failed
        assert row["rollout/failed_trajectories"] == 1.0
        assert row["rollout/reward_errors"] == 0.0
        assert row["rollout/turns_mean/number_guess"] <= TURNS
    trajectories, rewards = runs.finished_trajectories(run_dir, "number_guess", min_version=0)
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
        guess = [s for s in samples if s["source"] == "number_guess"]
        assert len(guess) == SAMPLES  # one sample per episode: its turns are one segment
        invalid_counts = []
        for sample in guess:  # the trained sample is its trajectory, token for token
            info = sample["reward_info"]
            seen.add(info["trajectory_id"])
            tokens, mask = runs.segment_tokens(by_id[info["trajectory_id"]], info["segment_id"])
            assert sample["prompt_ids"] + sample["response_ids"] == tokens
            assert [0] * len(sample["prompt_ids"]) + sample["loss_mask"] == mask
            text = tokenizer.decode(tokens)
            assert "Guess the secret whole number from 1 to 16." in text and '"guess"' in text  # schema, reset
            replies = [tokenizer.decode(run, skip_special_tokens=True) for run in sampled_runs(tokens, mask)]
            metrics = info["episode_metrics"]
            assert len(replies) == metrics["turns"] <= TURNS
            step_rewards, invalid = replay(sample["metadata"]["reset_seed"], replies)
            assert info["step_rewards"] == pytest.approx(step_rewards)
            assert metrics["invalid_actions"] == invalid
            assert text.count("Invalid action (") >= invalid - 1  # each answered (the last one ends the episode)
            assert sample["reward"] == pytest.approx(sum(step_rewards)) == info["episode_reward"]
            assert reward_of[info["trajectory_id"]] == sample["reward"]
            invalid_counts.append(invalid)
        mean = sum(invalid_counts) / len(invalid_counts)
        assert rows[step]["rollout/invalid_actions_mean/number_guess"] == pytest.approx(mean)
        failed = [s for s in samples if s["source"] == "flaky" and s["reward_info"].get("failed")]
        assert len(failed) == 1 and failed[0]["reward"] == 0.0
    assert seen == set(by_id)
