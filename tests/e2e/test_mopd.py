"""The tiny multi-teacher distillation recipe (``tiny/mopd``) end to end, kept short for CI.

Real CLI runs: two teachers warm-started by ``loongsage sft`` (``tiny/mopd_teacher``) on
sums and on differences, then the student distils from both, each data source from its own
teacher, the two teachers sharing one memory slot of a real teacher actor (swapped every
step, the next one prefetched), full-vocabulary KL with the teachers' logits rebuilt in the
train actor. Once synchronous, once asynchronous (disaggregated, ``windowed_fifo``, S = 1).

The teachers get a shorter SFT than the recipe's (``SFT_STEPS``): enough to make them far
from the student (15 steps: the KL starts near 0.5 nat per token and falls to 0.54-0.70 of
that in 8 steps, against the 0.8 asked), not to make them good. Asserted
per step: both sources and both teachers in the batch, exactly one swap (the resident
teacher runs first, the other is swapped in and stays), no RL (``opd.gkd_ratio=1``); over
the run: the KL to each teacher falls, its last ``WINDOW`` steps at most ``FALL`` of its
first ones. The full 20-step recipe's figures are in docs/distillation.md.
"""

from __future__ import annotations

import statistics

import pytest
from warm_starts import warm_start

pytestmark = pytest.mark.slow

SFT_STEPS = 15
STEPS = 8
WINDOW = 3
FALL = 0.8  # last WINDOW steps' KL at most 80 % of the first WINDOW steps'
SOURCES = ("add", "sub")


@pytest.fixture(scope="module")
def teachers(runs) -> dict[str, str]:
    """The two teacher model folders, each from a real ``loongsage sft`` run (tests/warm_starts.py)."""
    return {name: str(warm_start("tiny/mopd_teacher", f"trainer.sft.steps={SFT_STEPS}", "trainer.sft.examples=512",
                                 f"data_sources.0.dataset.operations=[{operation}]", env=runs.env()))
            for name, operation in (("add", "+"), ("sub", "-"))}


def distil(runs, run_dir, teachers, *overrides) -> list[dict]:
    runs.train(run_dir, f"opd.teachers.0.path={teachers['add']}", f"opd.teachers.1.path={teachers['sub']}",
               f"trainer.steps={STEPS}", "trainer.eval_interval=0", *overrides, config="tiny/mopd")
    rows = runs.metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(STEPS))
    return rows


def assert_distils(rows: list[dict]) -> None:
    for row in rows:
        assert all(f"rollout/reward_mean/{s}" in row for s in SOURCES)  # both sources, so both teachers
        assert row["teacher/swaps"] == 1, row  # two teachers, one slot, the resident one first
        assert row["teacher/compute_s"] > 0 and row["teacher/swap_s"] >= 0
        assert "train/pg_loss" not in row and row["train/loss"] == pytest.approx(row["opd/loss"], rel=1e-5)
        assert 0 <= row["opd/topk_overlap"] <= 1
    for scope in ("", *(f"/{s}" for s in SOURCES)):
        kl = [r[f"opd/kl{scope}"] for r in rows]
        first, last = statistics.mean(kl[:WINDOW]), statistics.mean(kl[-WINDOW:])
        assert first > 0.1 and last <= FALL * first, f"opd/kl{scope} did not fall: {kl}"


def test_tiny_mopd_sync_kl_falls_and_teachers_swap(tmp_path, runs, teachers):
    assert_distils(distil(runs, tmp_path / "sync", teachers))


def test_tiny_mopd_async_windowed_fifo_kl_falls_and_teachers_swap(tmp_path, runs, teachers):
    rows = distil(runs, tmp_path / "async", teachers, "async.enable=true", "placement.mode=disaggregated",
                  "async/window_policy=windowed_fifo", "async.stale_steps=1")
    assert_distils(rows)
    assert all(0 <= r["async/staleness_mean"] <= r["async/staleness_max"] <= 1 for r in rows)
    assert statistics.mean(r["async/staleness_mean"] for r in rows[1:]) > 0, "no step trained overlapped data"
