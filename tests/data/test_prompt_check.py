"""Every record checked before the run spends anything on it (``loongsage.data.prompt_check``).

Real pieces: JSONL files on disk read by the ``jsonl`` dataset of loongsage-agents, the source
built by config validation and ``build_sources``, the tiny model's real tokenizer and chat
template, the run's ``DataMixer``. Before, only the first 32 records went through the chat
template at start-up (the memory estimate's sample): a record at line 40 whose message
content was a dict trained two steps, then ended the run with ``TypeError: can only
concatenate str (not "dict") to str``; invalid UTF-8 was reported without file or line; a
20,000-token prompt failed at the engine (HTTP 400) naming no record.
"""

from __future__ import annotations

import json
import logging

import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from loongsage.config.validate import validate_config
from loongsage.data.mixer import DataMixer
from loongsage.data.prompt_check import CheckedSource, DataCheckFailed, PromptChecker, prompt_checker
from loongsage.data.sources import build_sources
from loongsage.plugins import get_registries


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def write_jsonl(path, records):
    with open(path, "wb") as handle:
        for record in records:
            handle.write(record if isinstance(record, bytes) else json.dumps(record).encode() + b"\n")
    return path


def good(i, words=3):
    return {"prompt": [{"role": "user", "content": f"question {i} " + "word " * words}],
            "reward_model": {"ground_truth": str(i)}}


def config(path, **rollout):
    return OmegaConf.create({"model": {"path": "unused"}, "rollout": rollout, "data_sources": [
        {"name": "p", "dataset": {"format": "jsonl", "path": str(path)}, "reward": {"name": "math"}}]})


def built(path, tokenizer, **rollout):
    run = validate_config(config(path, **rollout), get_registries())
    return run.cfg, build_sources(run.sources, get_registries(), 0, tokenizer)


def checker(tokenizer, cfg, budget_s=None):
    return PromptChecker(tokenizer, cfg.rollout.max_prompt_tokens, "rollout.max_prompt_tokens",
                         cfg.rollout.long_prompts, budget_s)


def test_a_record_the_chat_template_cannot_render_is_named_before_the_run(tmp_path, tokenizer):
    records = [good(i) for i in range(60)]
    records[39]["prompt"][0]["content"] = {"text": "a dict, not text"}  # line 40
    path = write_jsonl(tmp_path / "data.jsonl", records)
    cfg, sources = built(path, tokenizer)
    with pytest.raises(DataCheckFailed) as err:
        checker(tokenizer, cfg).scan(sources)
    assert str(err.value) == ("1 record(s) cannot be used:\n  data_sources[0] (source 'p') record 39 "
                              f"({path} line 40): TypeError: message content must be text, got dict")


def test_invalid_utf8_names_the_file_and_line(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "data.jsonl", [good(0), good(1), b'{"prompt": "caf\xe9", "x": 1}\n'])
    with pytest.raises(ValueError, match=rf"^data_sources\[0\].dataset: {path} line 3: invalid UTF-8 \(byte 0xe9 "
                                         r"at column 16: invalid continuation byte\)$"):
        built(path, tokenizer)


def test_a_prompt_above_max_prompt_tokens_is_refused_naming_it(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "data.jsonl", [good(0), good(1, words=400), good(2)])
    cfg, sources = built(path, tokenizer, max_prompt_tokens=100)
    with pytest.raises(DataCheckFailed) as err:
        checker(tokenizer, cfg).scan(sources)
    message = str(err.value)
    assert message.startswith(f"1 prompt(s) too long:\n  data_sources[0] (source 'p') record 1 ({path} line 2): "
                              "its prompt has ")
    assert "tokens, above the limit of 100 (rollout.max_prompt_tokens)" in message
    assert message.endswith("or leave them out of training with rollout.long_prompts=drop")


def test_dropped_long_prompts_are_never_drawn_and_are_counted(tmp_path, tokenizer, caplog):
    records = [good(i, words=400 if i % 3 == 0 else 3) for i in range(9)]  # records 0, 3, 6 too long
    path = write_jsonl(tmp_path / "data.jsonl", records)
    cfg, sources = built(path, tokenizer, max_prompt_tokens=100, long_prompts="drop")
    check = checker(tokenizer, cfg)
    with caplog.at_level(logging.WARNING):
        check.scan(sources)
    assert "rollout.long_prompts=drop: 3 prompt(s) left out of training" in caplog.text
    mixer = DataMixer([CheckedSource(sources["p"], check)], seed=0)
    drawn = [p.index for p in mixer.next_prompts(12)]  # two epochs of the 6 kept
    assert sorted(drawn) == sorted([1, 2, 4, 5, 7, 8] * 2)
    assert check.metrics() == {"data/skipped_records": 6.0}  # 3 per epoch
    assert check.metrics() == {"data/skipped_records": 0.0}


def test_past_the_time_budget_bad_records_are_skipped_and_counted_never_a_crash(tmp_path, tokenizer, caplog):
    records = [good(i) for i in range(8)]
    records[2]["prompt"][0]["content"] = ["not", "text"]
    records[5] = good(5, words=400)
    path = write_jsonl(tmp_path / "data.jsonl", records)
    cfg, sources = built(path, tokenizer, max_prompt_tokens=100)
    check = checker(tokenizer, cfg, budget_s=1e-9)  # runs out at once: nothing checked up front
    with caplog.at_level(logging.WARNING):
        check.scan(sources)
        mixer = DataMixer([CheckedSource(sources["p"], check)], seed=0)
        drawn = [p.index for p in mixer.next_prompts(12)]  # two epochs of the 6 good ones: the first read whole
    assert "budgets.prompt_check_s=1e-09 s ran out after " in caplog.text
    assert sorted(drawn) == sorted([0, 1, 3, 4, 6, 7] * 2)
    read = mixer.state_dict()["cursors"][0]  # records read: every one not drawn was skipped
    assert read >= 14 and check.metrics() == {"data/skipped_records": float(read - 12)}
    assert caplog.text.count("skipped data_sources[0]") == 2  # each bad record named once
    assert f"skipped data_sources[0] (source 'p') record 2 ({path} line 3): TypeError: message content " \
           "must be text, got list" in caplog.text
    assert f"skipped data_sources[0] (source 'p') record 5 ({path} line 6): its prompt has " in caplog.text


def test_the_limit_is_the_model_s_context_when_it_is_shorter(tmp_path, tokenizer, tiny_model_dir):
    cfg = OmegaConf.create({"model": {"path": str(tiny_model_dir)},
                            "rollout": {"max_prompt_tokens": 100_000, "long_prompts": "refuse"},
                            "budgets": {"prompt_check_s": 60.0}})
    check = prompt_checker(cfg, tokenizer)
    assert (check.max_tokens, check.limit_key) == (2047, "the model's context: max_position_embeddings=2048")
    cfg.rollout.max_prompt_tokens = 512
    assert prompt_checker(cfg, tokenizer).max_tokens == 512
