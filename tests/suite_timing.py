"""Per-test wall time for the suite's closing report (``make test``).

Each test's set-up, call and tear-down seconds are summed by node id in the process that
reports them (pytest-xdist's controller, or the only process) and appended as JSON lines to the
file named by ``LOONGSAGE_DURATIONS_FILE``, so the Makefile's two pytest runs (two files at a
time, then the serial tests) end in one report: ``python tests/suite_timing.py FILE SECONDS``
prints the suite's wall time and its ten slowest tests. Loaded by ``-p suite_timing``
(pyproject's addopts); without the variable it records nothing.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path

ENV = "LOONGSAGE_DURATIONS_FILE"
_seconds: dict[str, dict[str, float]] = defaultdict(dict)


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


if __name__ == "__main__":
    print(report(Path(sys.argv[1]), float(sys.argv[2])))
