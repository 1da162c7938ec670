"""LoongSage's Table 4 on this machine: five execution modes of a tiny recipe, real compute.

Each row runs ``loongsage train`` in a subprocess (its own Ray cluster, real embedded engine
over HTTP, TransferMesh weight sync, real GRPO updates) on one shared workload, chosen with
``--workload``:

* ``math`` (``tiny/grpo``): single-turn arithmetic, pure compute. ``rollout.max_new_tokens``
  is large enough (256) that lengths are long-tailed (after the warm start: median ~27
  tokens, a few past 100).
* ``agentic`` (``tiny/code_repair``): multi-turn code repair through the AgentFlow router;
  every turn's tool call (read the file, write the fix, run the tests) runs in the task's
  bubblewrap sandbox and the reward runs the hidden tests in a fresh one. The rollout waits
  on real process starts and test runs, long-tailed because tasks' tests differ.

Every row runs the same prompts (seed 0) from one warm start: ``loongsage sft`` on the
workload's recipe runs once (for ``agentic`` the one after which the tiny model writes tool
calls) and each row loads its model with ``trainer.sft.steps=0``.

The policy is held still (``--lr 1e-9``: every
forward, backward, optimizer step and weight sync still runs) so every row samples from that
same length distribution; with a real learning rate the rows' length distributions drift
apart as each learns (set ``--lr 2e-4`` to see it). Whether async learns as well as the
synchronous run is tests/e2e/test_async_tiny_learns.py's question. Metrics come from each
run's ``metrics.jsonl``.

Resources are equal across rows, as in Table 4 of baidu-baige/LoongSage's
`docs/en/fully-async-mode.md`: colocated rows run each phase in turn on both cores (2 torch
threads); async rows pin the trainer to one core and the rollout engine to the other (1 thread each,
``controller.actors.split_cores``). The row
``train s`` of a colocated and an async row is the same phase on 2 vs 1 thread: it is the
thread scaling that decides whether an even split can win.

Two bounds are printed. The ideal overlap bound is Table 4's: max(colocated rollout phase, the
rest of the colocated step). The work bound is this machine's: every process of a run
(trainer, engine, driver, router, sandboxes) shares the same cores, so a step can be no shorter
than its CPU seconds (``perf/run_cpu_s``, the whole process tree's) over the cores; the
colocated row's work bound caps the speedup of any schedule doing the same work here.

Rows (our ``S`` is a hard bound and equals LoongSage's ``stale_steps + 1``, docs/async.md):
  colocated                      synchronous
  colocated + partial            O = B/2 extra groups; unfinished ones aborted before training,
                                 continued under the new weights
  async no_window S=2            LoongSage "no-window, stale 1", partial rollout
  async windowed_fifo S=2        LoongSage "windowed-fifo, stale 1", partial rollout
  async windowed_fifo S=3        LoongSage "windowed-fifo, stale 2", partial rollout

``--trace`` runs the trace-driven simulator instead (``benchmarks/async_runtime.py``; every
flag after ``--trace`` is its own): cluster-scale predictions from a response-length
distribution, decode speed, training cost and resource split.

    .venv/bin/python benchmarks/async_modes.py [--workload math|agentic] [--steps 8] [--json]
    .venv/bin/python benchmarks/async_modes.py --trace [--split 0.5 --decode-ms 0.25 ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import async_runtime  # noqa: E402  (the trace-driven simulator and the shared row list)
from runs import run_env, warm_start  # noqa: E402  (benchmarks/runs.py)

ROWS = async_runtime.ROWS


@dataclass(frozen=True)
class Workload:
    config: str  # the recipe every row runs
    max_new_tokens: int  # per model turn


WORKLOADS = {
    "math": Workload("tiny/grpo", 256),
    "agentic": Workload("tiny/code_repair", 128),  # the recipe's warm start teaches the tool call
}


def overrides(row: "async_runtime.Row", args: argparse.Namespace) -> list[str]:
    """The config overrides of one row on the shared workload."""
    workload = WORKLOADS[args.workload]
    max_new_tokens = args.max_new_tokens or workload.max_new_tokens
    common = [
        f"model.path={args.model}", "trainer.sft.steps=0",
        f"trainer.steps={args.steps}", f"rollout.max_new_tokens={max_new_tokens}",
        f"rollout.prompts_per_step={args.batch}", f"train.lr={args.lr}", "checkpoint.interval=0",
        "trainer.eval_interval=0",
        "logging.progress_bar=false", "logging.samples_per_step=0",
    ]
    if row.colocated:
        mode = ["placement.mode=colocated"]
    else:
        mode = ["placement.mode=disaggregated", "async.enable=true", f"async/window_policy={row.policy}",
                f"async.stale_steps={row.stale_steps}"]
    partial = ["rollout.partial=true", f"rollout.oversample_groups={int(args.batch * row.oversample_frac)}"]
    return common + mode + (partial if row.partial else [])


def run_row(row: "async_runtime.Row", args: argparse.Namespace, root: Path) -> dict:
    run_dir = root / row.label.replace(" ", "_").replace("+", "plus").replace("=", "")
    cmd = [sys.executable, "-m", "loongsage.cli", "train", "--config-name", WORKLOADS[args.workload].config,
           f"trainer.run_dir={run_dir}", *overrides(row, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=run_env())
    if done.returncode != 0:
        raise RuntimeError(f"{row.label}: loongsage train failed ({done.returncode}):\n{done.stderr[-3000:]}")
    from loongsage.tracking.jsonl import read_metrics

    rows = read_metrics(run_dir / "metrics.jsonl")
    if [r["step"] for r in rows] != list(range(args.steps)):
        raise RuntimeError(f"{row.label}: metrics for steps {[r['step'] for r in rows]}, expected 0..{args.steps - 1}")

    def mean(key: str, skip: int = 0) -> float:
        return statistics.fmean(r.get(key, 0.0) for r in rows[skip:])

    return {
        "row": row.label,
        "step_s": mean("timing/step"),
        "step_s_excl_first": mean("timing/step", 1),
        "rollout_wait_s": mean("timing/rollout", 1),  # trainer blocked on data (whole phase if colocated)
        "train_s": mean("timing/train", 1),
        "cpu_s": statistics.fmean(r["perf/run_cpu_s"] for r in rows[1:]),  # core-seconds per step (local runs)
        "staleness_mean": mean("async/staleness_mean"),
        "staleness_max": max(r.get("async/staleness_max", 0.0) for r in rows),
        "partial_ratio": mean("rollout/partial_ratio"),
        "length_bias": rows[-1].get("rollout/length_bias", 1.0),
        "response_length_mean": mean("rollout/response_length_mean"),
        "reward_first3": statistics.fmean(r["rollout/reward_mean"] for r in rows[:3]),
        "reward_last3": statistics.fmean(r["rollout/reward_mean"] for r in rows[-3:]),
    }


def overlap_bound(colocated: dict) -> float:
    """The ideal overlap bound per step, as Table 4 reads it: the colocated step's rollout phase
    and the rest of it (train, weight sync, bookkeeping) run side by side at their colocated
    speeds, so a step takes the longer of the two. It is a bound only where the rollout phase
    is pure work: the phase also waits for its batch's slowest trajectories, a tail an async
    engine spends on the next groups (async rows beat it on the agentic workload of
    2026-12-01). Where every process shares the cores, ``work_bound`` may be higher, and then it
    is the one that holds (docs/benchmarks.md, 2026-12-06)."""
    rollout = colocated["rollout_wait_s"]
    return max(rollout, colocated["step_s_excl_first"] - rollout)


def work_bound(colocated: dict, cores: int) -> float:
    """The work bound per step on these cores: the colocated step's CPU seconds (every process
    of the run, sandboxes included) spread perfectly over ``cores``. Where trainer, engines,
    driver and sandboxes all share the machine's cores, no schedule of the same work finishes a
    step sooner; an async row that does more work per step (a second process's overheads, a
    slower one-core trainer) has a higher bound of its own (``cpu_s / cores``)."""
    return colocated["cpu_s"] / cores


def print_table(results: list[dict], args: argparse.Namespace) -> None:
    workload = WORKLOADS[args.workload]
    print(f"real compute, {args.workload} workload ({workload.config}) on this CPU: B={args.batch} prompts x 8 "
          f"samples, max_new_tokens={args.max_new_tokens or workload.max_new_tokens} per turn, lr {args.lr:g}, "
          f"{args.steps} steps; colocated = both cores per phase, async = 1 core each")
    head = (f"{'config':26s} {'step s':>7s} {'speedup':>8s} {'excl.1st':>9s} {'speedup':>8s} {'wait data':>10s} "
            f"{'train s':>8s} {'stale':>6s} {'max':>4s} {'partial':>8s} {'len bias':>9s} {'len':>6s} {'of bound':>9s} "
            f"{'CPU s':>6s} {'busy':>5s} {'of work':>8s}")
    print(head)
    print("-" * len(head))
    for r in results:
        print(f"{r['row']:26s} {r['step_s']:7.2f} {r['speedup']:7.2f}x {r['step_s_excl_first']:9.2f} "
              f"{r['speedup_excl_first']:7.2f}x {r['rollout_wait_s']:9.2f}s {r['train_s']:8.2f} "
              f"{r['staleness_mean']:6.2f} {r['staleness_max']:4.0f} {r['partial_ratio']:8.2f} "
              f"{r['length_bias']:9.3f} {r['response_length_mean']:6.1f} {r['of_bound']:8.2f}x "
              f"{r['cpu_s']:6.1f} {r['cores_busy']:5.2f} {r['of_work_bound']:7.2f}x")
    print(f"ideal overlap bound: {results[0]['bound_s']:.2f} s per step = max(colocated rollout phase, "
          "the rest of its step); 'of bound' = bound / row step time (excluding step 0), 1.00x = reached")
    print(f"work bound: {results[0]['work_bound_s']:.2f} s per step = the colocated row's {results[0]['cpu_s']:.1f} "
          f"CPU s per step over {results[0]['cores']} cores, so no schedule of its work beats "
          f"{results[0]['step_s_excl_first'] / results[0]['work_bound_s']:.2f}x; 'CPU s' = the whole run's CPU "
          "seconds per step, 'busy' = cores kept busy, 'of work' = work bound / row step time")
    pinned = [r for r in results if r["row"].startswith("async")]
    if pinned:
        one = statistics.fmean(r["train_s"] for r in pinned)
        print(f"thread scaling of the train phase: {results[0]['train_s']:.2f} s on 2 threads (colocated), "
              f"{one:.2f} s on 1 pinned core (async rows), {one / results[0]['train_s']:.2f}x")


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--trace" in argv:
        argv.remove("--trace")
        return async_runtime.main(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=8, help="prompt groups per step (B)")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="math")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="per model turn (default: the workload's, "
                        + ", ".join(f"{name} {w.max_new_tokens}" for name, w in WORKLOADS.items()) + ")")
    p.add_argument("--lr", type=float, default=1e-9, help="GRPO learning rate (default: policy held still)")
    p.add_argument("--rows", default="", help="comma-separated row numbers (1-5) to run; default all")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.steps < 4:
        p.error(f"--steps: expected at least 4 (the table reports means excluding step 0), got {args.steps}")
    picked = [ROWS[int(i) - 1] for i in args.rows.split(",")] if args.rows else list(ROWS)
    if picked[0] is not ROWS[0]:
        p.error("--rows: the colocated row (1) must come first: it is the baseline")

    with tempfile.TemporaryDirectory(prefix="async_modes_") as tmp:
        args.model = str(warm_start(WORKLOADS[args.workload].config, Path(tmp) / "warm_start"))
        results = [run_row(row, args, Path(tmp)) for row in picked]
    base = results[0]
    bound = overlap_bound(base)
    cores = len(os.sched_getaffinity(0))
    for r in results:
        r["speedup"] = base["step_s"] / r["step_s"]
        r["speedup_excl_first"] = base["step_s_excl_first"] / r["step_s_excl_first"]
        r["bound_s"] = bound
        r["of_bound"] = bound / r["step_s_excl_first"]
        r["cores"] = cores
        r["cores_busy"] = r["cpu_s"] / r["step_s_excl_first"]
        r["work_bound_s"] = work_bound(base, cores)
        r["of_work_bound"] = r["work_bound_s"] / r["step_s_excl_first"]
    if args.json:
        print(json.dumps({"benchmark": "async_modes", "simulated": False, "args": vars(args), "rows": results}))
    else:
        print_table(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
