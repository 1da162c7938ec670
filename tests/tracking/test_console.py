"""The console tracker's line per step: ``step i/N`` with training metrics under short names,
evaluation rows (the final evaluation comes after the last training step) with their ``eval/``
prefix, and an ETA from the pace of the steps logged so far; ``-q`` silences it."""

from __future__ import annotations

import re

import pytest

from loongsage.logs import configure_logging
from loongsage.tracking import console
from loongsage.tracking.console import ConsoleParams, ConsoleTracker, format_duration


@pytest.fixture(autouse=True)
def _info_logging():
    yield configure_logging(0)
    configure_logging(0)


def test_training_and_evaluation_rows(tmp_path, capsys):
    tracker = ConsoleTracker(ConsoleParams(), tmp_path, {})
    tracker.log({"rollout/reward_mean": 0.5, "train/loss": 0.01234, "other/x": 3.0}, 19)
    tracker.log({"eval/reward_mean": 1.0, "eval/correct_mean": 0.9375}, 20)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["step 19 | reward_mean 0.5 | loss 0.01234",
                     "step 20 | eval/reward_mean 1 | eval/correct_mean 0.9375"]


def test_every_skips_steps(tmp_path, capsys):
    tracker = ConsoleTracker(ConsoleParams(every=5), tmp_path, {})
    for step in range(11):
        tracker.log({"train/loss": float(step)}, step)
    assert [line.split(" |")[0] for line in capsys.readouterr().out.splitlines()] == \
        ["step 0", "step 5", "step 10"]


def test_step_of_total_and_eta_from_the_pace_so_far(tmp_path, capsys, monkeypatch):
    clock = iter([100.0, 110.0, 130.0, 190.0])  # steps 2, 3, 4 end 10 s apart on average
    monkeypatch.setattr(console.time, "monotonic", lambda: next(clock))
    tracker = ConsoleTracker(ConsoleParams(keys=["train/loss"]), tmp_path, {"trainer": {"steps": 8}})
    for step in (2, 3, 4):
        tracker.log({"train/loss": 1.0}, step)
    tracker.log({"eval/correct_mean": 0.5}, 8)  # the final evaluation row: nothing left
    lines = capsys.readouterr().out.splitlines()
    # after step 3: 10 s per step, 4 steps left; after step 4: 15 s per step, 3 left
    assert lines == ["step 2/8 | loss 1", "step 3/8 | loss 1 | eta 40s", "step 4/8 | loss 1 | eta 45s",
                     "step 8/8"]


def test_quiet_silences_the_step_lines(tmp_path, capsys):
    configure_logging(-1)
    ConsoleTracker(ConsoleParams(), tmp_path, {"trainer": {"steps": 3}}).log({"train/loss": 1.0}, 0)
    assert capsys.readouterr().out == ""


def test_durations_read_as_minutes_and_hours():
    assert [format_duration(s) for s in (4.4, 65, 3725)] == ["4s", "1m05s", "1h02m"]
    assert re.fullmatch(r"\d+s", format_duration(-3))


def test_times_carry_their_unit(tmp_path, capsys):
    tracker = ConsoleTracker(ConsoleParams(keys=["rollout/reward_mean", "timing/step", "timing/rollout"]), tmp_path, {})
    tracker.log({"rollout/reward_mean": 0.25, "timing/step": 4.306, "timing/rollout": 12.71}, 4)
    assert capsys.readouterr().out.splitlines() == ["step 4 | reward_mean 0.25 | step time 4.31 s | rollout time 12.7 s"]


def test_a_step_without_learning_signal_is_warned_about(tmp_path, caplog):
    tracker = ConsoleTracker(ConsoleParams(every=10), tmp_path, {})
    with caplog.at_level("WARNING", logger="loongsage.console"):
        tracker.log({"rollout/reward_mean": 1.0, "rollout/zero_variance_group_ratio": 1.0}, 3)
        tracker.log({"rollout/reward_mean": 0.5, "rollout/zero_variance_group_ratio": 0.75}, 4)
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert [r.getMessage().split(":")[0] for r in warnings] == ["step 3"]  # shown on a step `every` skips too
    assert "no learning signal" in warnings[0].getMessage() and "reward_mean 1" in warnings[0].getMessage()


def test_quiet_keeps_the_no_signal_warning(tmp_path, capsys):
    configure_logging(-1)
    ConsoleTracker(ConsoleParams(), tmp_path, {}).log({"rollout/zero_variance_group_ratio": 1.0}, 0)
    captured = capsys.readouterr()
    assert "step 0: no learning signal" in captured.out + captured.err
