"""Typed parameters of the dataset formats (torch-free, imported by ``plugin.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from omegaconf import MISSING


@dataclass
class SyntheticMathParams:
    """Seeded arithmetic word problems (add/subtract) with answers in \\boxed{}."""

    size: int = 10000  # distinct problems (one epoch)
    min_operand: int = 0  # smallest operand (>= 0)
    max_operand: int = 9  # 9: single-digit, 99: two-digit
    operations: List[str] = field(default_factory=lambda: ["+", "-"])  # drawn from: + | -
    num_operands: int = 2  # terms per problem (>= 2)
    allow_negative: bool = False  # False: subtractions never go below zero
    instruction: str = "Put your final answer in \\boxed{}."  # appended to every question
    # share of problems whose SFT demonstration calls the `calculator` tool (tool_loop agent)
    # with the expression, reads its result and boxes it; the rest show the worked solution
    tool_demonstrations: float = 0.0


@dataclass
class FileDatasetParams:
    """Prompts and ground truths read from a JSONL or Parquet file."""

    path: str = MISSING  # the file to read (~ expanded)
    prompt_field: str = "prompt"  # dotted path; a string or a list of chat messages
    ground_truth_field: str = "reward_model.ground_truth"  # dotted path (verl/DAPO layout)
    metadata_fields: List[str] = field(default_factory=list)  # dotted paths copied to metadata
    instruction: Optional[str] = None  # appended to the last user message when set
    limit: int = 0  # keep only the first `limit` rows (0 = all)


@dataclass
class HuggingFaceDatasetParams(FileDatasetParams):
    """Prompts from the `datasets` library: local files, a saved dataset, or a cached hub dataset."""

    # path: a folder written by Dataset.save_to_disk, a builder for local files ("json",
    # "parquet", "csv" with data_files), or a hub dataset id already in the local cache
    name: Optional[str] = None  # the dataset's configuration name, if it has several
    data_files: List[str] = field(default_factory=list)  # local files for a builder path
    split: str = "train"  # the split read


@dataclass
class CodeRepairParams:
    """Seeded Python functions with one bug each, visible tests in the repo, hidden tests to score."""

    size: int = 1000  # distinct prompts (one epoch)
    split: str = "train"  # train | heldout: tasks whose functions never occur in the other split
    heldout_share: float = 0.2  # share of all function sources that belong to the heldout split
    families: List[str] = field(default_factory=list)  # bug families to draw from; [] = all
    min_tests: int = 2  # visible test cases per task (the hidden tests add as many again, or more)
    max_tests: int = 5  # most visible test cases per task
    stress_share: float = 0.3  # share of tasks whose tests also call the function many times over
