"""A step's trained batch on disk: what ``rollout.record`` keeps and what replay and
``rollout.from_recording`` read.

    <run_dir>/batches/step_000003.json.gz   the step's groups, in the order the step trained them

Each file holds the groups exactly as the trainer received them (every sample's prompt and
response ids, loss mask, rollout logprobs, weight versions, reward, reward fields, finish
reason, sampling seed, MoE routes), nothing the step computed from them: rebuilding the batch
from the file gives the step's ``TrainBatch`` bit for bit (floats are written with Python's
shortest round-tripping ``repr`` and logprobs are float32 values, so nothing is rounded).
JSON under gzip, because it is readable with nothing but the standard library and a tiny
run's step is a few kilobytes (``benchmarks/determinism_cost.py`` measures it).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from loongsage.data.types import Group
from loongsage.runtime.pipeline import group_from_dict, group_to_dict

FOLDER = "batches"
RESULTS = ("train_logprobs", "advantages", "values")  # per-token outputs of a step: not inputs


def batch_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / FOLDER / f"step_{step:06d}.json.gz"


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


def save_batch(run_dir: Path, step: int, groups: Sequence[Group]) -> Path:
    """Write ``groups`` (the step's, in training order) as the step's recorded batch."""
    rows = []
    for group in groups:
        row = group_to_dict(group)
        for sample in row["samples"]:
            for name in RESULTS:
                sample.pop(name, None)
            sample["routed_experts"] = _plain(sample["routed_experts"])
        rows.append(row)
    path = batch_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as handle:
        json.dump({"step": step, "groups": rows}, handle, separators=(",", ":"))
    tmp.replace(path)
    return path


def load_batch(run_dir: Path, step: int) -> list[Group]:
    """The recorded groups of ``step``; a clear error when the run did not record it."""
    path = batch_path(run_dir, step)
    if not path.is_file():
        recorded = sorted(p.name for p in path.parent.glob("step_*.json.gz")) if path.parent.is_dir() else []
        have = f"it has {len(recorded)} ({recorded[0]} .. {recorded[-1]})" if recorded else "it has none"
        raise FileNotFoundError(f"{path}: no recorded batch of step {step} in {run_dir} ({have}); "
                                "train with rollout.record=true to keep every step's batch")
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        data = json.load(handle)
    return [group_from_dict(row) for row in data["groups"]]


def recorded_steps(run_dir: Path) -> list[int]:
    """The steps ``run_dir`` holds a recorded batch of, in order."""
    folder = Path(run_dir) / FOLDER
    return sorted(int(p.name[len("step_"):-len(".json.gz")]) for p in folder.glob("step_*.json.gz"))
