"""The ``reasoning_gym`` environment: task mixing, held-out split, errors, and scoring through a
real router with the real library (reasoning-gym 0.1.25).

Episodes run through the real AgentFlow router and openai SDK; the engine behind the router is
the scripted one of ``tests/agents/conftest.py`` (the random tiny model cannot be made to write
a chosen answer), so the test decides the reply and checks the task's own score of it. The
end-to-end run with the real engine is ``tests/e2e/test_reasoning_gym.py``.
"""

from __future__ import annotations

import asyncio

import pytest
from environment_sources import GYM, built, config
from omegaconf import OmegaConf

from loongsage.config.validate import validate_config
from loongsage.errors import ConfigError
from loongsage.plugins import get_registries



def run_group(source, prompt, n, engine):
    return asyncio.run(source.agent.run_group(prompt, n, engine, {"max_new_tokens": 16}))


def test_reasoning_gym_task_errors_name_the_task_key():
    registries = get_registries()
    with pytest.raises(ConfigError, match=r"^data_sources\[0\]\.environment\.tasks\[1\]\.name: reasoning-gym "
                                          r"has no task 'leg_count'; did you mean 'leg_counting'\?"):
        built(registries, {"name": "rg", "environment": {**GYM, "tasks": ["basic_arithmetic", "leg_count"]}})
    with pytest.raises(ConfigError, match=r"^data_sources\[0\]\.environment: invalid parameters .*"
                                          r"tasks\[0\]\.weight: expected a positive number, got 0"):
        validate_config(config({"name": "rg", "environment": {**GYM, "tasks": [{"name": "x", "weight": 0}]}}),
                        registries)


def test_reasoning_gym_mixes_tasks_by_weight_and_holds_out_other_questions():
    held = {"name": "held", "environment": GYM, "eval_only": True}
    run, sources = built(get_registries(), {"name": "rg", "environment": GYM}, held)
    train, held_out = sources["rg"], sources["held"]
    assert (train.size(), held_out.size()) == (40, 8)
    tasks = [train.get(i).metadata["task"] for i in range(40)]
    assert (tasks.count("basic_arithmetic"), tasks.count("leg_counting")) == (10, 30)
    questions = {p.messages[-1]["content"] for p in map(train.get, range(40))}
    held_questions = {held_out.get(i).messages[-1]["content"] for i in range(8)}
    assert len(held_questions) == 8 and not questions & held_questions
    assert [held_out.get(i).metadata["split"] for i in range(8)] == ["held_out"] * 8
    # reasoning-gym's entry i of seed 1 is entry i + 1 of seed 0: every one repeats a training
    # question but the last, and repeats are dropped
    near = {"name": "near", "environment": {**GYM, "held_out_seed": 1}, "eval_only": True}
    _, overlapping = built(get_registries(), {"name": "rg", "environment": GYM}, near)
    near_questions = {overlapping["near"].get(i).messages[-1]["content"] for i in range(8)}
    assert len(near_questions) == 8 and not questions & near_questions
    node = OmegaConf.to_container(run.cfg.data_sources[0])
    assert node["environment"]["type"] == "reasoning_gym" and node["environment"]["episode_timeout_s"] == 300.0
    assert node["dataset"] is node["agent"] is node["reward"] is None


def test_reasoning_gym_scores_each_reply_with_the_tasks_own_scorer(scripted_engine, tokenizer):
    import reasoning_gym

    _, sources = built(get_registries(), {"name": "rg", "environment": GYM}, tokenizer=tokenizer)
    source = sources["rg"]
    prompt = source.get(3)
    entry = reasoning_gym.create_dataset(prompt.metadata["task"], seed=0, size=40)[prompt.metadata["task_index"]]
    assert prompt.messages[-1]["content"] == entry["question"] and prompt.ground_truth == entry["answer"]
    replies = [f"<answer>{entry['answer']}</answer>", "<answer>nope</answer>", f"let me see\n{entry['answer']}"]
    try:
        for reply, expected in zip(replies, (1.0, 0.0, 1.0)):
            [sample] = run_group(source, prompt, 1, scripted_engine([reply]))
            assert sample.text == reply and sample.reward_info["episode_reward"] == expected
            assert tokenizer.decode(sample.response_ids, skip_special_tokens=True) == reply
            assert sum(sample.loss_mask) == len(sample.response_ids)
            assert sample.reward_info["episode_metrics"] == {"correct": expected,
                                                             f"correct_{prompt.metadata['task']}": expected}
            assert source.score(sample.text, prompt.ground_truth, prompt=prompt, sample=sample) == {"score": expected}
    finally:
        source.agent.close()


def test_without_the_library_the_error_names_the_extra_before_anything_starts(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # found by no import from here on
    with pytest.raises(ConfigError) as err:
        validate_config(config({"name": "rg", "environment": GYM}), get_registries())
    message = str(err.value)
    assert message.startswith("data_sources[0].environment.type: environment 'reasoning_gym' needs the "
                              "'reasoning_gym' library, which is not installed; install the extra "
                              "[reasoning-gym] of loongsage-agents: ")
    assert message.endswith("reasoning-gym==0.1.25'")  # what the installed extra adds


def test_a_task_named_twice_with_two_configs_is_scored_against_its_own_entries(scripted_engine, tokenizer):
    import reasoning_gym

    easy = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    hard = {"min_terms": 3, "max_terms": 3, "min_digits": 3, "max_digits": 3}
    gym = {"type": "reasoning_gym", "size": 10, "held_out_size": 2,
           "tasks": [{"name": "basic_arithmetic", "config": easy}, {"name": "basic_arithmetic", "config": hard}]}
    _, sources = built(get_registries(), {"name": "rg", "environment": gym}, tokenizer=tokenizer)
    source = sources["rg"]
    prompt = next(p for p in map(source.get, range(10)) if p.metadata["task_number"] == 1)
    entry = reasoning_gym.create_dataset("basic_arithmetic", seed=0, size=10, **hard)[prompt.metadata["task_index"]]
    assert prompt.messages[-1]["content"] == entry["question"]
    try:
        [sample] = run_group(source, prompt, 1, scripted_engine([f"<answer>{entry['answer']}</answer>"]))
    finally:
        source.agent.close()
    assert sample.reward_info["episode_reward"] == 1.0
