"""metrics.jsonl rows carry their wall-clock time (UTC, ISO 8601), next to the step and the
metrics, and a non-finite value is written as null."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from loongsage.tracking.jsonl import JsonlParams, JsonlTracker, read_metrics


def test_every_row_has_a_utc_timestamp(tmp_path):
    tracker = JsonlTracker(JsonlParams(), tmp_path, {})
    before = datetime.now(timezone.utc).replace(microsecond=0)
    tracker.log({"train/loss": 0.5}, 0)
    tracker.log({"train/loss": float("nan")}, 1)
    tracker.close()
    after = datetime.now(timezone.utc)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["train/loss"]) for r in rows] == [(0, 0.5), (1, None)]
    for row in rows:
        stamp = datetime.fromisoformat(row["time"])
        assert stamp.utcoffset() == timedelta(0) and before <= stamp <= after
    assert list(json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])) == ["step", "time", "train/loss"]
