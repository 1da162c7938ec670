"""Data sources resolved by config validation and built through the real registries
(loongsage-agents installed)."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from loongsage.config.validate import validate_config
from loongsage.data.mixer import DataMixer
from loongsage.data.sources import build_sources
from loongsage.errors import ConfigError, UnknownPluginError
from loongsage.plugins import get_registries


@pytest.fixture(scope="module")
def registries():
    return get_registries()


def config(*specs, seed=0):
    return OmegaConf.create({"model": {"path": "unused"}, "trainer": {"seed": seed}, "data_sources": list(specs)})


def build(cfg, registries):
    """What a run does: validation resolves every source's plugins once, then they are built."""
    run = validate_config(cfg, registries)
    return build_sources(run.sources, registries, run.cfg.trainer.seed)


MATH = {"name": "math", "dataset": {"format": "synthetic_math", "size": 40}, "reward": "math"}


def test_builds_dataset_reward_and_params(registries):
    spec = {
        "name": "arith",
        "weight": 3,
        "dataset": {"format": "synthetic_math", "size": 40, "max_operand": 99},
        "reward": {"name": "math", "format_score": 0.25},
        "sampling": {"temperature": 0.7},
        "system_prompt": "You are a careful calculator.",
    }
    source = build(config(spec, seed=4), registries)["arith"]
    assert source.size() == 40 and source.weight == 3 and source.sampling == {"temperature": 0.7}
    assert source.dataset.params.max_operand == 99 and source.dataset.seed == 4
    prompt = source.get(7)
    assert (prompt.source, prompt.index) == ("arith", 7)
    assert prompt.messages[0] == {"role": "system", "content": "You are a careful calculator."}
    assert prompt.messages[1] == source.dataset.get(7).messages[0]
    truth = prompt.ground_truth
    assert source.score(f"so \\boxed{{{truth}}}", truth) == {"score": 1.0, "correct": True, "boxed": True}
    assert source.score("\\boxed{-12345}", truth)["score"] == 0.25
    assert source.agent is None  # no tokenizer given


def test_system_prompt_replaces_the_datasets_own(registries, tmp_path):
    path = tmp_path / "p.jsonl"
    row = {"prompt": [{"role": "system", "content": "old"}, {"role": "user", "content": "1+1?"}], "answer": "2"}
    path.write_text(json.dumps(row) + "\n")
    spec = {
        "name": "f",
        "dataset": {"format": "jsonl", "path": str(path), "ground_truth_field": "answer"},
        "reward": "math",
        "system_prompt": "new",
    }
    prompt = build(config(spec), registries)["f"].get(0)
    assert prompt.messages == [{"role": "system", "content": "new"}, {"role": "user", "content": "1+1?"}]


def test_unknown_reward_names_the_key_and_closest_match(registries):
    bad = dict(MATH, name="b", reward={"name": "maths"})
    with pytest.raises(UnknownPluginError) as err:
        build(config(MATH, bad), registries)
    message = str(err.value)
    assert message.startswith("data_sources[1].reward.name: unknown reward 'maths'")
    assert "Did you mean 'math'?" in message and "math (loongsage-agents)" in message


def test_unknown_dataset_format_and_bad_params_name_their_keys(registries):
    with pytest.raises(UnknownPluginError, match=r"^data_sources\[0\]\.dataset\.format: unknown dataset 'jsonlines'"):
        build(config(dict(MATH, dataset={"format": "jsonlines"})), registries)
    with pytest.raises(ConfigError, match=r"data_sources\[0\]\.dataset.*max_operand"):
        build(config(dict(MATH, dataset={"format": "synthetic_math", "max_operand": "lots"})), registries)
    with pytest.raises(ConfigError, match=r"^data_sources\[0\]\.dataset\.max_operand: 1 is below"):
        build(
            config(dict(MATH, dataset={"format": "synthetic_math", "min_operand": 5, "max_operand": 1})), registries
        )
    with pytest.raises(ConfigError, match=r"^data_sources\[0\]\.dataset: .*nope.jsonl' does not exist"):
        build(config(dict(MATH, dataset={"format": "jsonl", "path": "/nope.jsonl"})), registries)


def test_duplicate_names_and_missing_reward(registries):
    with pytest.raises(ConfigError, match=r"data_sources\[1\]\.name: duplicate"):
        build(config(MATH, MATH), registries)
    no_reward = {k: v for k, v in MATH.items() if k != "reward"}
    with pytest.raises(ConfigError, match=r"data_sources\[0\]\.reward: required"):
        build(config(no_reward), registries)


def test_mixer_over_built_sources_is_seeded(registries):
    cfg = config(dict(MATH, name="a", weight=2), dict(MATH, name="b"), seed=9)
    picks = []
    for _ in range(2):
        mixer = DataMixer.from_sources(build(cfg, registries), 9, batch_size=6)
        batch = mixer.next_prompts(6)
        assert [p.source for p in batch].count("a") == 4
        picks.append([(p.source, p.index, p.messages[-1]["content"]) for p in batch])
    assert picks[0] == picks[1]


def test_eval_only_sources_are_left_out_of_training_and_are_all_evaluations_read(registries):
    from loongsage.data.sources import evaluation_sources, training_sources

    held_out = {**MATH, "name": "held_out", "eval_only": True}
    sources = build(config(MATH, held_out), registries)
    assert list(training_sources(sources)) == ["math"]
    assert list(evaluation_sources(sources)) == ["held_out"]
    mixer = DataMixer.from_sources(training_sources(sources), 0, batch_size=8)
    assert {p.source for p in mixer.next_prompts(8)} == {"math"}
    plain = build(config(MATH), registries)
    assert list(evaluation_sources(plain)) == list(training_sources(plain)) == ["math"]
    with pytest.raises(ConfigError, match=r"^data_sources\[0\]\.eval_only: every data source is eval_only"):
        build(config(held_out), registries)
