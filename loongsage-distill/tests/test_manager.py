"""The Teacher Manager: placement, the order a slot runs its buckets in, and real slots on Ray.

Three real tiny teachers (``conftest.py``) in one shared slot and in three resident slots must
give every row the same outputs; in the shared slot a call swaps at most (teachers - 1)
times, runs the resident teacher first and leaves the last one resident.
"""

from __future__ import annotations

import os

import pytest
import torch

from loongsage.controller.actors import spawn_engine
from loongsage.controller.placement import Seat
from loongsage.plugin.testing import registries_with
from loongsage_distill.config import TeacherSpec
from loongsage_distill.manager import TeacherManager, merge_rows, place, schedule
from loongsage_distill.teacher_engine import Wants


def test_place_splits_teachers_into_contiguous_groups_of_near_equal_size():
    assert place(3, 1) == [[0, 1, 2]]
    assert place(3, 2) == [[0, 1], [2]]
    assert place(3, 3) == [[0], [1], [2]]
    assert place(5, 2) == [[0, 1, 2], [3, 4]]
    for slots in (0, 4):
        with pytest.raises(ValueError):
            place(3, slots)


def test_schedule_runs_the_resident_teacher_first():
    assert schedule([0, 1, 2], resident=2) == [2, 0, 1]
    assert schedule([0, 1], resident=2) == [0, 1]
    assert schedule([1], resident=1) == [1]


def test_merge_rows_pads_narrower_hidden_states():
    parts = [(torch.tensor([0, 2]), {"hidden": torch.ones(2, 3, 4)}), (torch.tensor([1]), {"hidden": torch.ones(1, 3, 2)})]
    merged = merge_rows(parts, 4)["hidden"]
    assert merged.shape == (4, 3, 4) and merged[1, :, 2:].abs().sum() == 0 and merged[3].abs().sum() == 0
    assert merged[[0, 2]].eq(1).all() and merged[1, :, :2].eq(1).all()


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=1 << 30)
    yield ray
    if started:
        ray.shutdown()


def manager(teacher_dirs, slots):
    engine = registries_with().resolve("engine", "embedded_teacher", "opd.teachers[0].backend")
    teachers = tuple(TeacherSpec(i, f"t{i}", str(d), engine) for i, d in enumerate(teacher_dirs))

    def spawn(ref, cfg, role):
        return spawn_engine(ref.obj, cfg, Seat(role, 0, "", 0, num_cpus=0, num_gpus=0, threads=1))

    config = {"model": {"dtype": "float32", "fp32_lm_head": True}, "train": {"logprob_chunk_tokens": 8}}
    return TeacherManager(teachers, slots, prefetch=True, config=config, spawn=spawn)


@pytest.mark.slow
def test_a_shared_slot_and_resident_slots_give_every_row_the_same_outputs(ray_cluster, teacher_dirs):
    shared, resident = manager(teacher_dirs, 1), manager(teacher_dirs, 3)
    try:
        assert shared.described[0]["teachers"] == ["t0", "t1", "t2"] and len(resident.slots) == 3
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(3, 400, (6, 10), generator=g)
        mask = torch.ones_like(ids)
        wants = Wants(entropy=True, topk=3, hidden=True)
        calls = [torch.tensor([0, 1, 2, 2, 1, 0]), torch.tensor([0, -1, 0, 0, -1, 0]), torch.tensor([1, 2, 1, 2, 1, 2])]
        swaps = []
        for row_teacher in calls:
            before = shared.resident[0]
            out, metrics = shared.compute(ids, mask, row_teacher, wants)
            want, want_metrics = resident.compute(ids, mask, row_teacher, wants)
            assert out.keys() == want.keys() == {"logprobs", "entropy", "topk_logprobs", "topk_ids", "hidden"}
            for key in want:
                torch.testing.assert_close(out[key], want[key], atol=0, rtol=0)
            none = row_teacher < 0
            assert out["logprobs"][none].abs().sum() == 0 and out["logprobs"][~none].abs().sum() > 0
            present = sorted(set(row_teacher[~none].tolist()))
            order = schedule(present, before)
            assert metrics["teacher/swaps"] == sum(t != p for t, p in zip(order, [before, *order])) <= 2
            swaps.append(metrics["teacher/swaps"])
            assert shared.resident[0] == order[-1]
            assert want_metrics["teacher/swaps"] == 0  # resident slots never swap
            assert metrics["teacher/compute_s"] > 0 and metrics["teacher/overlap_s"] <= metrics["teacher/copy_s"]
        assert swaps == [2, 1, 2]  # 0 -> 1 -> 2; 2 -> 0 (teacher 0 only); 0 -> 1 -> 2
    finally:
        for actor in [*shared.slots, *resident.slots]:
            ray_cluster.kill(actor)
