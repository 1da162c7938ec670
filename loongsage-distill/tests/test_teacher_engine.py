"""The embedded teacher engine: teachers sharing one memory slot behave as if each had its own.

Real tiny-Qwen2 teachers (perturbed copies, ``conftest.py``). A slot holding three teachers
must give, after any sequence of swaps, with and without prefetch, exactly the outputs each
teacher gives alone; swaps are counted; a teacher of another architecture is refused with
its config key.
"""

from __future__ import annotations

import pytest
import torch

from loongsage.plugin import ConfigError
from loongsage_distill.teacher_engine import EmbeddedTeacherEngine, Job, Wants

WANTS = Wants(entropy=True, topk=5, hidden=True)


def teachers(dirs):
    return [{"name": f"t{i}", "path": str(d), "key": f"opd.teachers[{i}]"} for i, d in enumerate(dirs)]


def batch(seed, n=3, length=12):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 400, (n, length), generator=g)
    mask = torch.ones(n, length, dtype=torch.long)
    mask[0, -4:] = 0
    return ids, mask


@pytest.fixture(scope="module")
def alone(teacher_dirs):
    return [EmbeddedTeacherEngine(teachers([d]), chunk_tokens=4) for d in teacher_dirs]


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_shared_slot_gives_each_teacher_its_own_outputs(teacher_dirs, alone, prefetch):
    slot = EmbeddedTeacherEngine(teachers(teacher_dirs), chunk_tokens=4, prefetch=prefetch)
    calls = [[0, 1, 2], [2, 0], [0], [1, 2]]
    resident = 0
    for call, order in enumerate(calls):
        jobs = [Job(t, *batch(seed=10 * call + t)) for t in order]
        outputs, stats = slot.forward(jobs, WANTS)
        for job, out in zip(jobs, outputs):
            (want,), _ = alone[job.teacher].forward([Job(0, job.input_ids, job.attention_mask)], WANTS)
            assert out.keys() == want.keys() == {"logprobs", "entropy", "topk_logprobs", "topk_ids", "hidden"}
            for key in want:
                torch.testing.assert_close(out[key], want[key], atol=0, rtol=0)
        assert stats["swaps"] == sum(t != prev for t, prev in zip(order, [resident, *order]))
        assert stats["resident"] == order[-1]
        resident = order[-1]
        assert 0.0 <= stats["overlap_s"] <= min(stats["copy_s"], stats["compute_s"]) + 1e-9
        if not prefetch:
            assert stats["overlap_s"] == 0.0  # every copy ran inside switch, before its forward
    out = alone[0].forward([Job(0, *batch(seed=99))], Wants(entropy=False))[0][0]
    assert set(out) == {"logprobs"}


def test_outputs_are_aligned_like_the_train_engine(teacher_dirs, alone):
    ids, mask = batch(seed=5)
    (out,), _ = alone[0].forward([Job(0, ids, mask)], WANTS)
    assert (out["logprobs"][:, 0] == 0).all() and (out["logprobs"][0, -4:] == 0).all()
    real = mask[:, 1:].bool()
    assert (out["logprobs"][:, 1:][real] < 0).all()
    best = out["topk_logprobs"][..., 0][:, 1:][real]  # the teacher's most likely token's log-prob
    top = out["topk_logprobs"]
    assert (best >= out["logprobs"][:, 1:][real]).all() and (top[..., :-1] >= top[..., 1:]).all()
    assert out["topk_ids"].dtype == torch.long and out["hidden"].shape == (*ids.shape, 256)


def test_a_teacher_of_another_architecture_is_refused(teacher_dirs, tiny_model_dir, tmp_path, make_teacher):
    other = make_teacher(tiny_model_dir, tmp_path / "other", seed=7, rms_norm_eps=1e-3)
    with pytest.raises(ConfigError, match=r"opd\.teachers\[1\]\.path: .*architectures differ.*rms_norm_eps"):
        EmbeddedTeacherEngine(teachers([teacher_dirs[0], other]))
