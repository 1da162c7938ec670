"""The simulated async benchmark runs end to end and its rows respect their bounds.

It sleeps instead of computing (it is a scheduling simulation by design); the test checks
the numbers it reports are the ones the schedules guarantee, never its speed.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "async_runtime.py"


def test_benchmark_json_rows(capsys) -> None:
    spec = importlib.util.spec_from_file_location("async_runtime_bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # dataclasses look their module up while the file loads
    spec.loader.exec_module(bench)
    assert bench.main(["--steps", "3", "--batch", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["row"]: r for r in out["rows"]}
    assert list(rows) == [r.label for r in bench.ROWS]
    assert rows["colocated"]["staleness_max"] == 0 and rows["colocated"]["speedup"] == 1.0
    assert rows["colocated"]["length_bias"] == 1.0  # trains exactly what it generates
    assert rows["colocated + partial"]["staleness_max"] <= 1  # S=0 plus ceil(O/B)=1
    for row in bench.ROWS[2:]:
        assert rows[row.label]["staleness_max"] <= row.stale_steps
