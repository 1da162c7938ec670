"""The suite's timing: per-test seconds recorded, reported, and used to order the files.

Record and report: each test's set-up, call and tear-down seconds are summed by node id in the
process that reports them (pytest-xdist's controller, or the only process) and appended as
JSON lines to the file named by ``LOONGSAGE_DURATIONS_FILE``, so the Makefile's two pytest runs
(two files at a time, then the serial tests) end in one report:
``python tests/suite_timing.py FILE SECONDS`` prints the suite's wall time and its ten slowest
tests; ``--update`` also rewrites ``tests/file_durations.json`` from FILE.

Order: pytest-xdist's ``loadfile`` hands each worker one file at a time in collection order
(with ``--no-loadscope-reorder``; by default it puts the files with the most tests first,
which leaves the long single-test end-to-end files for last and one worker idle at the end).
Collection is sorted by each file's recorded seconds, slowest first, the longest-processing-
time rule, so the two workers finish close together. Loaded by ``-p suite_timing``
(pyproject's addopts); without the variable it records nothing.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path

ENV = "LOONGSAGE_DURATIONS_FILE"
FILE_DURATIONS = Path(__file__).with_name("file_durations.json")
_seconds: dict[str, dict[str, float]] = defaultdict(dict)


def pytest_collection_modifyitems(items) -> None:
    """Files with the most recorded seconds first; a stable sort keeps each file's own order."""
    if not FILE_DURATIONS.exists():
        return
    seconds = json.loads(FILE_DURATIONS.read_text(encoding="utf-8"))
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::", 1)[0], 0.0))


def pytest_runtest_logreport(report) -> None:
    if os.environ.get(ENV):
        _seconds[report.nodeid][report.when] = report.duration


def pytest_sessionfinish(session) -> None:
    path = os.environ.get(ENV)
    if not path or hasattr(session.config, "workerinput"):  # xdist workers: the controller writes
        return
    with open(path, "a", encoding="utf-8") as out:
        for nodeid, phases in _seconds.items():
            out.write(json.dumps({"test": nodeid, **phases}) + "\n")
    _seconds.clear()


def report(path: Path, wall_s: float, top: int = 10) -> str:
    """The suite's wall time, its summed test time and the ``top`` slowest tests."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    totals = sorted(((sum(r.get(p, 0.0) for p in ("setup", "call", "teardown")), r) for r in rows),
                    key=lambda pair: -pair[0])
    lines = [f"test suite: {wall_s / 60:.1f} min wall for {len(rows)} tests "
             f"({sum(t for t, _ in totals) / 60:.1f} min of test time); the {top} slowest:"]
    for seconds, row in totals[:top]:
        split = " / ".join(f"{row.get(p, 0.0):.0f}" for p in ("setup", "call", "teardown"))
        lines.append(f"  {seconds:7.1f} s  ({split} set-up/call/tear-down)  {row['test']}")
    return "\n".join(lines)


def file_seconds(path: Path) -> dict[str, float]:
    """Each test file's recorded seconds (all phases of all its tests), slowest first."""
    totals: dict[str, float] = defaultdict(float)
    for line in path.read_text(encoding="utf-8").splitlines():
        if line:
            row = json.loads(line)
            totals[row["test"].split("::", 1)[0]] += sum(row.get(p, 0.0) for p in ("setup", "call", "teardown"))
    return {f: round(s, 1) for f, s in sorted(totals.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    recorded, wall = Path(sys.argv[1]), float(sys.argv[2])
    print(report(recorded, wall))
    if "--update" in sys.argv[3:]:
        FILE_DURATIONS.write_text(json.dumps(file_seconds(recorded), indent=1) + "\n", encoding="utf-8")
