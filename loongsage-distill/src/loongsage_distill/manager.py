"""The Teacher Manager: teachers placed in memory slots, a batch bucketed by teacher.

Placement (baidu-baige/LoongSage ``coda/controller/teacher_manager.py``): with S slots and T
teachers the teachers are split into S contiguous groups (sizes differing by at most one), one slot
(one teacher engine in a Ray actor) per group. S ≥ T makes every teacher resident; S < T makes a
group share one slot, swapping weights in from host memory. Config validation refuses S > T;
teachers of one slot must share an architecture and an engine backend.

``compute`` buckets a batch's rows by their teacher, and sends every slot its buckets in one
call, the resident teacher first, so a call swaps at most (teachers in the slot − 1) times
and the last teacher stays resident for the next call; slots run in parallel. Beyond
baidu-baige/LoongSage, the engine prefetches the next bucket's teacher while the current one
computes. The returned metrics add the slots' ``teacher/swaps``, ``teacher/swap_s`` (seconds blocked
switching), ``teacher/compute_s`` (forward seconds), ``teacher/overlap_s`` (seconds a prefetch copy
ran while a forward did) and ``teacher/copy_s``.
"""

from __future__ import annotations

from typing import Any, Callable

import ray
import torch

from loongsage.plugin import ConfigError

from loongsage_distill.config import TeacherSpec
from loongsage_distill.teacher_engine import Job, Wants

METRICS = ("swaps", "swap_s", "compute_s", "overlap_s", "copy_s")


def place(teachers: int, slots: int) -> list[list[int]]:
    """Contiguous groups of teacher indices, one per slot, sizes differing by at most one."""
    if not 1 <= slots <= teachers:
        raise ValueError(f"need 1 <= slots <= teachers, got {slots} slots for {teachers} teachers")
    base, extra = divmod(teachers, slots)
    groups, start = [], 0
    for slot in range(slots):
        size = base + (slot < extra)
        groups.append(list(range(start, start + size)))
        start += size
    return groups


def schedule(present: list[int], resident: int) -> list[int]:
    """The order a slot runs its buckets in: the resident teacher first, then slot order."""
    return sorted(present, key=lambda t: (t != resident, t))


def _check_backends(group: list[TeacherSpec]) -> None:
    for teacher in group[1:]:
        if teacher.engine.name != group[0].engine.name:
            raise ConfigError(f"{teacher.key}.backend", f"teacher {teacher.name!r} shares a memory slot with "
                              f"{group[0].name!r} but names engine {teacher.engine.name!r}, not "
                              f"{group[0].engine.name!r}; a slot is one engine")


class TeacherManager:
    """Teacher slots on the cluster and the per-batch bucketing (module docstring)."""

    def __init__(self, teachers: tuple[TeacherSpec, ...], slots: int, prefetch: bool, config: dict,
                 spawn: Callable[[Any, dict, str], Any]) -> None:
        self.groups = place(len(teachers), slots)
        self.actors: dict[str, Any] = {}
        self.resident: list[int] = []
        for slot, group in enumerate(self.groups):
            members = [teachers[i] for i in group]
            _check_backends(members)
            cfg = {**config, "teacher_slot": {
                "teachers": [{"name": t.name, "path": t.path, "key": t.key} for t in members], "prefetch": prefetch}}
            self.actors[f"teacher{slot}"] = spawn(members[0].engine, cfg, f"teacher{slot}")
            self.resident.append(group[0])
        self.slots = list(self.actors.values())
        self.described = ray.get([a.call.remote("describe") for a in self.slots])

    def compute(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, row_teacher: torch.Tensor,
                wants: Wants) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Every row's teacher outputs (zeros for rows with teacher -1) and the call's metrics."""
        calls, plans = [], []
        for slot, group in enumerate(self.groups):
            present = [t for t in group if bool((row_teacher == t).any())]
            if not present:
                continue
            order = schedule(present, self.resident[slot])
            rows = [(row_teacher == t).nonzero().squeeze(-1) for t in order]
            jobs = [Job(group.index(t), input_ids[r], attention_mask[r]) for t, r in zip(order, rows)]
            calls.append(self.slots[slot].call.remote("forward", jobs, wants))
            plans.append((slot, group, rows))
        metrics = {f"teacher/{m}": 0.0 for m in METRICS}
        parts: list[tuple[torch.Tensor, dict[str, torch.Tensor]]] = []
        for (slot, group, rows), (outputs, stats) in zip(plans, ray.get(calls)):
            self.resident[slot] = group[int(stats["resident"])]
            for m in METRICS:
                metrics[f"teacher/{m}"] += stats[m]
            parts += list(zip(rows, outputs))
        return merge_rows(parts, len(row_teacher)), metrics


def merge_rows(parts: list[tuple[torch.Tensor, dict[str, torch.Tensor]]], rows: int) -> dict[str, torch.Tensor]:
    """One ``[rows, ...]`` tensor per output key from each bucket's ``(row index, outputs)``.

    Teachers in different slots may differ in hidden size: a key's trailing dimensions are
    the largest any bucket returned, smaller ones zero-padded at the end.
    """
    merged: dict[str, torch.Tensor] = {}
    keys = {key for _, out in parts for key in out}
    for key in sorted(keys):
        values = [(index, out[key]) for index, out in parts if key in out]
        trailing = [max(v.shape[d] for _, v in values) for d in range(1, values[0][1].dim())]
        merged[key] = values[0][1].new_zeros(rows, *trailing)
        for index, value in values:
            merged[key][(index, *(slice(0, n) for n in value.shape[1:]))] = value
    return merged
