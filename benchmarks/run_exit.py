"""How long a finished ``loongsage train`` takes to go away: this tree against a baseline commit.

The test suite and every scripted sweep run the CLI in a subprocess and wait for it, output
captured (``subprocess.run(..., capture_output=True)``). What they wait for after the run's last
useful line ("final model: ...", written once the final model, metrics and run files are
complete) is pure teardown: the run's actors, Ray's daemons, the interpreter. This benchmark
runs the same short run (tiny model, no warm start, ``--steps`` steps) ``--repeats`` times per
side, the sides interleaved (the machine may be shared and noisy), and reports per run, from
the arrival of that line: the driver's exit, the end of its output pipes (what
``subprocess.run`` returns on: a daemon or helper that inherited them holds them open), and
the end of the last process of the run (every process it starts carries a marker in its
environment, as in ``tests/e2e/test_sigterm.py``).

``--baseline REF`` checks REF out in a temporary git worktree and runs it with its source
folders first on ``PYTHONPATH`` (ahead of this tree's editable installs); without it only this
tree runs. ``--json`` prints the rows, the medians per side and their ratio this tree / baseline.

    .venv/bin/python benchmarks/run_exit.py [--baseline main] [--repeats 3] [--steps 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runs import run_env  # noqa: E402  (benchmarks/runs.py)

from loongsage.controller.ray_sessions import processes_marked  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DISTRIBUTIONS = ("loongsage-core", "loongsage-algos", "loongsage-agents", "loongsage-distill", "loongsage-sandbox")
LAST_USEFUL = "final model:"
MARKER = "LOONGSAGE_BENCH_RUN"
PHASES = ("exit_s", "pipes_closed_s", "all_gone_s")


def timed_run(python_path: str | None, run_dir: Path, steps: int) -> dict[str, float]:
    """One short run; seconds from its last useful line to its exit, its pipes' end, its last process's end."""
    mark = uuid.uuid4().hex
    env = {**run_env(), MARKER: mark}
    if python_path:
        env["PYTHONPATH"] = python_path
    cmd = [sys.executable, "-m", "loongsage.cli", "train", "--config-name", "tiny/grpo", f"trainer.run_dir={run_dir}",
           f"trainer.steps={steps}", "trainer.sft.steps=0", "rollout.prompts_per_step=4",
           "rollout.n_samples_per_prompt=2", "rollout.max_new_tokens=12", "logging.progress_bar=false"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict[str, float] = {}
    lines: list[str] = []

    def read(stream) -> None:
        for line in stream:
            lines.append(line)
            if LAST_USEFUL in line:
                seen["last_useful"] = time.monotonic()

    readers = [threading.Thread(target=read, args=(s,), daemon=True) for s in (proc.stdout, proc.stderr)]
    for reader in readers:
        reader.start()
    proc.wait(timeout=900)
    seen["exit"] = time.monotonic()
    for reader in readers:
        reader.join(timeout=120)
    seen["pipes_closed"] = time.monotonic()
    while processes_marked(MARKER, mark) and time.monotonic() - seen["exit"] < 120:
        time.sleep(0.02)
    seen["all_gone"] = time.monotonic()
    if proc.returncode != 0 or "last_useful" not in seen:
        raise SystemExit(f"run failed ({proc.returncode}):\n{''.join(lines[-40:])}")
    return {f"{phase}_s": round(seen[phase] - seen["last_useful"], 3) for phase in ("exit", "pipes_closed", "all_gone")}


@contextmanager
def baseline_tree(ref: str) -> Iterator[str]:
    """``ref`` checked out in a temporary worktree; yields the ``PYTHONPATH`` of its source folders."""
    with tempfile.TemporaryDirectory(prefix="run_exit_baseline_") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), ref],
                       check=True, capture_output=True)
        try:
            yield os.pathsep.join(str(tree / dist / "src") for dist in DISTRIBUTIONS)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", help="a git ref to compare with (run from a temporary worktree)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="run_exit_") as tmp, \
            (baseline_tree(args.baseline) if args.baseline else nullcontext()) as base_path:
        sides = ([(f"baseline {args.baseline}", base_path)] if args.baseline else []) + [("this tree", None)]
        for repeat in range(args.repeats):
            for side, python_path in sides:
                row = {"side": side, "repeat": repeat,
                       **timed_run(python_path, Path(tmp) / f"{len(rows)}", args.steps)}
                rows.append(row)
                if not args.json:
                    print(f"{side:>20} #{repeat}: " + "  ".join(f"{k} {row[k]:6.2f}" for k in PHASES), flush=True)
    medians = {side: {k: statistics.median(r[k] for r in rows if r["side"] == side) for k in PHASES}
               for side, _ in sides}
    ratios = ({k: round(medians["this tree"][k] / medians[sides[0][0]][k], 3) for k in PHASES}
              if args.baseline else {})
    if args.json:
        print(json.dumps({"rows": rows, "medians": medians, "this_over_baseline": ratios}, indent=2))
        return
    print(f"\nmedian seconds after the line {LAST_USEFUL!r} ({args.repeats} runs per side):")
    print(f"{'side':>20}  " + "  ".join(f"{k:>15}" for k in PHASES))
    for side, values in medians.items():
        print(f"{side:>20}  " + "  ".join(f"{values[k]:15.2f}" for k in PHASES))
    if ratios:
        print(f"{'this / baseline':>20}  " + "  ".join(f"{ratios[k]:15.2f}" for k in PHASES))


if __name__ == "__main__":
    main()
