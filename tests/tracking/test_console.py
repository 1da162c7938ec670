"""The console tracker's line per step: training metrics with short names, evaluation rows
(the final evaluation comes after the last training step) with their ``eval/`` prefix."""

from __future__ import annotations

from loongsage.tracking.console import ConsoleParams, ConsoleTracker


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
