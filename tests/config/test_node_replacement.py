"""Replacing a whole config node from the command line: ``data_sources.0.dataset='{format:
jsonl, path: x.jsonl}'`` swaps the recipe's synthetic dataset for a JSONL file (Hydra merges a
mapping into the node, which failed on the keys the old node lacks, with "unknown key; did you
mean data_sources.0.dataset?"); the new node gets its plugin's defaults and its own checks, and a
mapping whose keys the node has still merges as in Hydra."""

from __future__ import annotations

import pytest

from loongsage.config.compose import load_config
from loongsage.errors import ConfigError

RECIPE = "tiny/grpo"


def test_a_mapping_replaces_the_whole_dataset_node(tmp_path):
    data = tmp_path / "x.jsonl"
    data.write_text('{"prompt": "1 + 1 = ?", "answer": "2"}\n')
    run = load_config(RECIPE, [f"data_sources.0.dataset={{format: jsonl, path: {data}, ground_truth_field: answer}}",
                               "trainer.steps=3"])
    dataset = run.cfg.data_sources[0].dataset
    assert dict(dataset) == {"format": "jsonl", "path": str(data), "prompt_field": "prompt",
                             "ground_truth_field": "answer", "metadata_fields": [], "instruction": None, "limit": 0}
    assert run.cfg.trainer.steps == 3 and run.cfg.data_sources[0].agent.name == "single_turn"


def test_the_new_node_is_checked_as_the_plugins_own():
    with pytest.raises(ConfigError, match=r"data_sources\[0\]\.dataset\.pth: .*did you mean data_sources\[0\]\.dataset\.path"):
        load_config(RECIPE, ["data_sources.0.dataset={format: jsonl, pth: x.jsonl}"])


def test_a_mapping_of_keys_the_node_has_still_merges():
    run = load_config(RECIPE, ["data_sources.0.dataset={max_operand: 5}"])
    dataset = run.cfg.data_sources[0].dataset
    assert dataset.format == "synthetic_math" and dataset.max_operand == 5 and list(dataset.operations) == ["+"]
