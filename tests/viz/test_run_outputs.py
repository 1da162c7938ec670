"""What a real tiny run leaves for the viewer and the trackers: each saved sample carries its
loss mask, rollout and train (pi_old) logprob and weight version per response token (the train
logprobs agree with the rollout's on the trained tokens, as they must when trainer and engine
hold the same weights, which they would not if misaligned by one position), and the
TensorBoard events hold exactly the metrics.jsonl values."""

from __future__ import annotations

import json
import math

import pytest

from loongsage.tracking.jsonl import read_metrics

pytestmark = pytest.mark.slow


def test_saved_samples_carry_per_token_train_and_rollout_logprobs(tiny_run):
    rows = [json.loads(line) for p in sorted((tiny_run / "samples").glob("step_*.jsonl"))
            for line in p.read_text().splitlines()]
    assert len(rows) == 2 * 2 * 2  # steps x prompts x samples (samples_per_step keeps them all)
    for row in rows:  # the prompt's ground truth is saved with it (what the reward checked)
        assert row["ground_truth"] not in (None, "") and isinstance(row["metadata"], dict)
        n = len(row["response_ids"])
        assert len(row["loss_mask"]) == len(row["rollout_logprobs"]) == len(row["train_logprobs"]) == n
        assert len(row["weight_versions"]) == n and min(row["weight_versions"]) >= 1  # after the warm start
        trained = [i for i, m in enumerate(row["loss_mask"]) if m]
        assert trained
        for i in trained:
            assert row["train_logprobs"][i] <= 0.0
            assert abs(row["train_logprobs"][i] - row["rollout_logprobs"][i]) < 1e-3, (i, row["step"])


def test_tensorboard_events_equal_metrics_jsonl(tiny_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = read_metrics(tiny_run / "metrics.jsonl")
    events = EventAccumulator(str(tiny_run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    expected = {}
    for row in rows:
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                expected.setdefault(key, []).append((row["step"], float(value)))
    assert set(events.Tags()["scalars"]) == set(expected)
    for key, points in expected.items():
        got = [(e.step, e.value) for e in events.Scalars(key)]
        assert [s for s, _ in got] == [s for s, _ in points], key
        assert [v for _, v in got] == pytest.approx([v for _, v in points], rel=1e-6, abs=1e-30), key


def test_the_saved_samples_reach_tensorboard_as_text(tiny_run):
    """``logging.tracker_samples_every`` (10): step 0's saved samples, with their ground truth and
    rewards, as TensorBoard's text table; step 1 has none."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    saved = [json.loads(line) for line in (tiny_run / "samples" / "step_000000.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(tiny_run / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    [event] = events.Tensors("samples/text_summary")
    lines = event.tensor_proto.string_val[0].decode().splitlines()
    assert event.step == 0 and len(lines) == 2 + len(saved)
    for line, sample in zip(lines[2:], saved):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert cells[5] == str(sample["ground_truth"]) and float(cells[6]) == sample["reward"]
