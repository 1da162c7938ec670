"""Dataset formats: the seeded synthetic math task and JSONL/Parquet files (verl/DAPO layout)."""

from __future__ import annotations

import json
import operator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loongsage.plugin import ConfigError
from loongsage_agents.datasets.jsonl import JsonlDataset
from loongsage_agents.datasets.params import FileDatasetParams, SyntheticMathParams
from loongsage_agents.datasets.parquet import ParquetDataset
from loongsage_agents.datasets.records import DatasetRecordError
from loongsage_agents.datasets.synthetic_math import SyntheticMathDataset
from loongsage_agents.rewards.math import math_reward

OPS = {"+": operator.add, "-": operator.sub}


def evaluate(expression: str) -> int:
    tokens = expression.split()
    total = int(tokens[0])
    for op, value in zip(tokens[1::2], tokens[2::2]):
        total = OPS[op](total, int(value))
    return total


def test_synthetic_math_is_a_pure_function_of_seed_and_index():
    a = SyntheticMathDataset(SyntheticMathParams(size=200), seed=1)
    b = SyntheticMathDataset(SyntheticMathParams(size=200), seed=1)
    c = SyntheticMathDataset(SyntheticMathParams(size=200), seed=2)
    assert len(a) == 200
    assert [a.get(i) for i in (0, 17, 199)] == [b.get(i) for i in (0, 17, 199)]
    assert a.get(17) == a.get(17)
    assert sum(a.get(i).messages != c.get(i).messages for i in range(50)) > 40
    with pytest.raises(IndexError):
        a.get(200)


@pytest.mark.parametrize(
    "params",
    [
        SyntheticMathParams(size=300),
        SyntheticMathParams(size=300, max_operand=99, num_operands=3),
        SyntheticMathParams(size=300, operations=["-"], allow_negative=True, min_operand=1),
    ],
)
def test_synthetic_math_answers_are_right_and_in_range(params):
    data = SyntheticMathDataset(params, seed=0)
    negatives = 0
    for i in range(len(data)):
        prompt = data.get(i)
        expression = prompt.metadata["expression"]
        terms = [int(t) for t in expression.split()[::2]]
        assert all(params.min_operand <= t <= params.max_operand for t in terms)
        assert len(terms) == params.num_operands
        assert int(prompt.ground_truth) == evaluate(expression)
        negatives += int(prompt.ground_truth) < 0
        content = prompt.messages[0]["content"]
        assert prompt.messages[0]["role"] == "user" and content.endswith("\\boxed{}.")
        assert math_reward(prompt.metadata["solution"], prompt.ground_truth)["correct"] is True
    assert (negatives > 0) == params.allow_negative


def test_synthetic_math_uses_several_phrasings():
    data = SyntheticMathDataset(SyntheticMathParams(size=100), seed=0)
    openings = {data.get(i).messages[0]["content"].split()[0] for i in range(100)}
    assert len(openings) >= 6


@pytest.mark.parametrize(
    "change, key",
    [
        ({"max_operand": -1, "min_operand": 0}, "dataset.max_operand"),
        ({"num_operands": 1}, "dataset.num_operands"),
        ({"operations": ["*"]}, "dataset.operations"),
        ({"size": 0}, "dataset.size"),
    ],
)
def test_synthetic_math_rejects_bad_params(change, key):
    with pytest.raises(ConfigError) as err:
        SyntheticMathDataset(SyntheticMathParams(**change), seed=0)
    assert err.value.key == key


DAPO_ROWS = [
    {
        "data_source": "math_dapo",
        "prompt": [{"role": "user", "content": f"Solve problem {i}. Answer: $Answer"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": str(i * 3), "style": "rule-math"},
        "extra_info": {"index": f"id-{i}"},
    }
    for i in range(5)
]


def write_jsonl(path: Path, rows, blank_lines=False) -> Path:
    lines = [json.dumps(r) for r in rows]
    if blank_lines:
        lines.insert(1, "")
    path.write_text("\n".join(lines) + "\n")
    return path


def write_parquet(path: Path, rows) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture(params=["jsonl", "parquet"])
def dapo_file(request, tmp_path):
    if request.param == "jsonl":
        return JsonlDataset, write_jsonl(tmp_path / "dapo.jsonl", DAPO_ROWS, blank_lines=True)
    return ParquetDataset, write_parquet(tmp_path / "dapo.parquet", DAPO_ROWS)


def test_reads_dapo_layout_with_nested_fields(dapo_file):
    cls, path = dapo_file
    params = FileDatasetParams(
        path=str(path), metadata_fields=["extra_info.index", "data_source"], instruction="Box it."
    )
    data = cls(params, seed=0)
    assert len(data) == 5
    prompt = data.get(3)
    assert prompt.index == 3 and prompt.ground_truth == "9"
    assert prompt.messages == [{"role": "user", "content": "Solve problem 3. Answer: $Answer\nBox it."}]
    assert prompt.metadata == {"extra_info.index": "id-3", "data_source": "math_dapo"}
    assert cls(FileDatasetParams(path=str(path), limit=2), seed=0).get(1).ground_truth == "3"
    assert len(cls(FileDatasetParams(path=str(path), limit=2), seed=0)) == 2


@pytest.mark.parametrize("writer, cls", [(write_jsonl, JsonlDataset), (write_parquet, ParquetDataset)])
def test_reads_flat_string_prompts(tmp_path, writer, cls):
    rows = [{"question": "What is 2+2?", "answer": 4}, {"question": "What is 1+5?", "answer": 6}]
    path = writer(tmp_path / f"flat.{cls.format}", rows)
    data = cls(FileDatasetParams(path=str(path), prompt_field="question", ground_truth_field="answer"), 0)
    assert data.get(1).messages == [{"role": "user", "content": "What is 1+5?"}]
    assert data.get(1).ground_truth == 6


def test_jsonl_errors_name_file_line_and_field(tmp_path):
    rows = [DAPO_ROWS[0], {"prompt": "hi", "reward_model": {"style": "x"}}]
    path = write_jsonl(tmp_path / "bad.jsonl", rows, blank_lines=True)
    with pytest.raises(DatasetRecordError) as err:
        JsonlDataset(FileDatasetParams(path=str(path)), 0)
    assert f"{path} line 3: field 'reward_model.ground_truth' (dataset.ground_truth_field) is missing" in str(err.value)
    path.write_text(json.dumps(DAPO_ROWS[0]) + "\n{not json\n")
    with pytest.raises(DatasetRecordError, match=r"bad.jsonl line 2: invalid JSON"):
        JsonlDataset(FileDatasetParams(path=str(path)), 0)
    path.write_text(json.dumps({"prompt": [{"content": "no role"}], "reward_model": {"ground_truth": "1"}}))
    with pytest.raises(DatasetRecordError, match=r"line 1: field 'prompt'\[0\]: expected a message"):
        JsonlDataset(FileDatasetParams(path=str(path)), 0)
    with pytest.raises(FileNotFoundError, match="dataset.path"):
        JsonlDataset(FileDatasetParams(path=str(tmp_path / "missing.jsonl")), 0)


def test_parquet_errors_name_file_row_and_field(tmp_path):
    path = write_parquet(tmp_path / "dapo.parquet", DAPO_ROWS)
    with pytest.raises(DatasetRecordError) as err:
        ParquetDataset(FileDatasetParams(path=str(path), ground_truth_field="reward_model.answer"), 0)
    message = str(err.value)
    assert "field 'reward_model.answer' (dataset.ground_truth_field) is not a column" in message
    assert "reward_model.ground_truth" in message and "extra_info" in message
    rows = [dict(r) for r in DAPO_ROWS]
    rows[2] = dict(rows[2], reward_model={"ground_truth": None, "style": "x"})
    path = write_parquet(tmp_path / "nulls.parquet", rows)
    data = ParquetDataset(FileDatasetParams(path=str(path)), 0)
    assert data.get(1).ground_truth == "3"
    with pytest.raises(DatasetRecordError, match=r"nulls.parquet row 2: field 'reward_model.ground_truth' .* is null"):
        data.get(2)
