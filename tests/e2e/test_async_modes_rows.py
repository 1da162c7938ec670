"""benchmarks/async_modes.py: its five rows are the intended, valid run configurations.

The benchmark itself trains five real runs (minutes); here each row's overrides go through
the real config composition and validation, and the scheduler built from the result has the
row's placement, window policy, bound and capacity. ``--trace`` hands over to the simulator
(benchmarks/async_runtime.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "async_modes.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("async_modes_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file loads
    spec.loader.exec_module(module)
    return module


class _NoPrompts:
    def next_prompt(self):
        raise AssertionError("the scheduler must not draw prompts before next_batch")


def _window(run) -> tuple[str, int, int]:
    from loongsage.runtime.scheduler import async_scheduler_from_config

    sched = async_scheduler_from_config(run.cfg, run.window_policy, prompt_source=_NoPrompts(),
                                        rollout_group=lambda *a, **k: None, abort_inflight=lambda: None)
    try:
        pipe = sched.pipeline
        return type(pipe.policy).__name__, pipe.capacity, pipe.staleness_bound
    finally:
        sched.close()


@pytest.mark.parametrize("workload, recipe, max_new_tokens",
                         [("math", "tiny/grpo", 256), ("agentic", "tiny/code_repair", 128)])
def test_rows_compose_into_the_table4_modes(bench, workload, recipe, max_new_tokens, tiny_model_dir) -> None:
    from loongsage.config.compose import load_config

    args = argparse.Namespace(steps=8, batch=8, max_new_tokens=None, lr=1e-9, workload=workload,
                              model=str(tiny_model_dir))
    expected = [  # placement, async, partial, (policy, capacity C, bound S')
        ("colocated", False, False, None),
        ("colocated", False, True, ("NoWindow", 8 + 4, 1)),
        ("disaggregated", True, True, ("NoWindow", 8 * 3, 2)),
        ("disaggregated", True, True, ("WindowedFifo", 8 * 3, 2)),
        ("disaggregated", True, True, ("WindowedFifo", 8 * 4, 3)),
    ]
    assert len(bench.ROWS) == len(expected)
    for row, (placement, asynchronous, partial, window) in zip(bench.ROWS, expected):
        assert bench.WORKLOADS[workload].config == recipe
        run = load_config(recipe, bench.overrides(row, args))
        cfg = run.cfg
        assert (cfg.placement.mode, cfg["async"].enable, cfg.rollout.partial) == (placement, asynchronous, partial)
        assert cfg.rollout.max_new_tokens == max_new_tokens and cfg.train.lr == 1e-9 and cfg.trainer.steps == 8
        assert cfg.model.path == str(tiny_model_dir) and cfg.trainer.sft.steps == 0  # every row: one warm start
        if window is not None:
            assert _window(run) == window, row.label


def test_trace_mode_is_the_simulator(bench, capsys) -> None:
    assert bench.main(["--trace", "--steps", "2", "--batch", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["benchmark"] == "async_runtime" and out["simulated"] is True
    assert [r["row"] for r in out["rows"]] == [r.label for r in bench.ROWS]
