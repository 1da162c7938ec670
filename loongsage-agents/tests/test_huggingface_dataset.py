"""The ``huggingface`` dataset format through the real ``datasets`` library: local JSON files
through the ``json`` builder, a folder written by ``save_to_disk`` (a Dataset and a DatasetDict
split), and the same prompts the ``jsonl`` format reads from the same records; a wrong field is
refused at construction with the columns there are, a missing split with the splits."""

from __future__ import annotations

import json

import pytest

from loongsage.plugin.testing import installed_registries

RECORDS = [
    {"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}], "reward_model": {"ground_truth": str(2 * i)},
     "level": i % 3}
    for i in range(7)
]


def build(**params):
    entry = installed_registries().dataset.entry("huggingface")
    return entry.obj(entry.build_params(params, "data_sources[0].dataset"), 0)


def prompts(dataset):
    return [(p.messages, p.ground_truth, p.metadata) for p in (dataset.get(i) for i in range(len(dataset)))]


@pytest.fixture
def jsonl_file(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path


def test_local_files_through_the_json_builder_match_the_jsonl_format(jsonl_file, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    dataset = build(path="json", data_files=[str(jsonl_file)], metadata_fields=["level"], instruction="Box it.")
    entry = installed_registries().dataset.entry("jsonl")
    reference = entry.obj(entry.build_params({"path": str(jsonl_file), "metadata_fields": ["level"],
                                              "instruction": "Box it."}, "d"), 0)
    assert len(dataset) == len(RECORDS) and prompts(dataset) == prompts(reference)
    assert dataset.get(3).messages[-1]["content"] == "What is 3 + 3?\nBox it." and dataset.get(3).ground_truth == "6"


def test_saved_dataset_and_dataset_dict_split(tmp_path):
    import datasets

    datasets.Dataset.from_list(RECORDS).save_to_disk(str(tmp_path / "saved"))
    split = datasets.DatasetDict({"train": datasets.Dataset.from_list(RECORDS[:5]),
                                  "test": datasets.Dataset.from_list(RECORDS[5:])})
    split.save_to_disk(str(tmp_path / "dict"))
    assert [p.ground_truth for p in map(build(path=str(tmp_path / "saved")).get, range(7))] == \
        [r["reward_model"]["ground_truth"] for r in RECORDS]
    test = build(path=str(tmp_path / "dict"), split="test", limit=1)
    assert len(test) == 1 and test.get(0).ground_truth == "10"
    with pytest.raises(ValueError, match=r"no split 'validation' \(dataset.split\); splits: train, test"):
        build(path=str(tmp_path / "dict"), split="validation")


def test_wrong_field_is_refused_at_start_with_the_columns(tmp_path):
    import datasets

    datasets.Dataset.from_list(RECORDS).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(ValueError, match=r"field 'answer' \(dataset.ground_truth_field\) is missing; "
                                         r"top-level keys: level, prompt, reward_model"):
        build(path=str(tmp_path / "saved"), ground_truth_field="answer")


def test_missing_local_files_fail_as_a_file_error_naming_them(tmp_path):
    """An OSError, which ``build_source`` reports as a ConfigError at data_sources[i].dataset."""
    with pytest.raises(FileNotFoundError, match="none.jsonl"):
        build(path="json", data_files=[str(tmp_path / "none.jsonl")])
