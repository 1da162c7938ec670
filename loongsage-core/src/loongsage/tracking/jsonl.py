"""JSONL tracker: appends one JSON object per step to ``<run_dir>/metrics.jsonl``.

Each row carries its wall-clock time (``"time"``: ISO 8601, UTC, to the second), so rows can be
lined up with logs and with other runs.

Each line is flushed and fsynced, so a crash loses at most the step in progress; on resume
the file is truncated to the steps before the resumed step, so no step appears twice.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Mapping

from loongsage.tracking.base import Tracker


@dataclass
class JsonlParams:
    """Append one JSON object per step to metrics.jsonl in the run directory."""

    filename: str = "metrics.jsonl"  # the file, relative to the run directory


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """All complete metric lines of a metrics.jsonl file (a torn last line is ignored)."""
    rows = []
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    break
    except FileNotFoundError:
        return []
    return rows


class JsonlTracker(Tracker):
    """Write ``{"step": N, "time": "2026-12-06T08:00:00+00:00", <metric>: value, ...}`` lines to metrics.jsonl."""

    def __init__(self, params, run_dir, config) -> None:
        super().__init__(params, run_dir, config)
        self.path = self.run_dir / params.filename
        self._handle = None

    def truncate_before(self, step: int) -> None:
        """Drop lines of ``step`` and later (resume after a crash)."""
        kept = [row for row in read_metrics(self.path) if row.get("step", -1) < step]
        with open(self.path, "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in kept)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if self._handle is None:
            self._handle = open(self.path, "a", encoding="utf-8")
        row = {"step": step, "time": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        row.update({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()})
        self._handle.write(json.dumps(row) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
