"""Typed parameters of the environments in this package (torch-free, imported by ``plugin.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, List, Optional


def task_entries(tasks: List[Any]) -> list[dict[str, Any]]:
    """``tasks`` as ``[{name, weight, config}]``: a bare name is weight 1 with the task's defaults."""
    if not tasks:
        raise ValueError("tasks: name at least one reasoning-gym task, e.g. [basic_arithmetic]")
    out = []
    for i, task in enumerate(tasks):
        entry = {"name": task} if isinstance(task, str) else dict(task) if isinstance(task, dict) else None
        if entry is None or not isinstance(entry.get("name"), str) or set(entry) - {"name", "weight", "config"}:
            raise ValueError(f"tasks[{i}]: expected a task name or {{name, weight, config}}, got {task!r}")
        weight, config = entry.get("weight", 1.0), entry.get("config") or {}
        if not isinstance(weight, (int, float)) or not weight > 0:
            raise ValueError(f"tasks[{i}].weight: expected a positive number, got {weight!r}")
        if not isinstance(config, dict):
            raise ValueError(f"tasks[{i}].config: expected a mapping of the task's options, got {config!r}")
        out.append({"name": entry["name"], "weight": float(weight), "config": dict(config)})
    return out


HELD_OUT_OFFSET = 1_000_000_007  # reasoning-gym seeds entry i with Random(seed + i)


@dataclass
class ReasoningGymParams:
    """Procedurally generated reasoning-gym tasks, one chat turn each, scored by the task itself."""

    requires: ClassVar[tuple[str, str, str]] = ("reasoning_gym", "loongsage-agents", "reasoning-gym")

    tasks: List[Any] = field(default_factory=lambda: ["basic_arithmetic"])  # names or {name, weight, config}
    size: int = 1000  # training tasks, split over the tasks by weight
    held_out_size: int = 100  # held-out tasks (an eval_only source reads them)
    seed: int = 0  # reasoning-gym's seed of the training tasks
    # of the held-out ones; None = seed + HELD_OUT_OFFSET (entry i of seed s is entry i + 1 of
    # seed s - 1 in reasoning-gym, so nearby seeds overlap); questions also in training are dropped
    held_out_seed: Optional[int] = None
    # prepended as the system message; the answer inside <answer></answer> is what the task scores
    system_prompt: Optional[str] = ("Answer the question. Put only the final answer inside "
                                    "<answer></answer>, e.g. <answer>42</answer>.")

    def __post_init__(self) -> None:
        task_entries(list(self.tasks))
        if self.size < 1 or self.held_out_size < 0:
            raise ValueError(f"size must be >= 1 and held_out_size >= 0, got {self.size} and {self.held_out_size}")
