"""What bitwise reproducibility and recording cost: step time and disk per step, side by side.

    python benchmarks/determinism_cost.py [--steps 5] [--prompts 4] [--samples 4] [--rounds 2] [--json]

Runs the tiny GRPO recipe (no warm start) with the same seed and data once per row and round
(rounds interleave the rows, so a load change on the machine hits every row alike):

* ``default``: the engine decodes up to ``rollout.max_running_requests`` (64) requests together;
* ``deterministic``: ``rollout.max_running_requests=1``, every request decoded alone, so its
  rollout log-probabilities do not depend on which requests shared its decode batch
  (docs/debugging.md: the knob a bitwise-reproducible run needs);
* ``record``: the default plus ``rollout.record=true`` (every step's batch kept, for
  ``loongsage replay`` and ``rollout.from_recording``);
* ``deterministic+record``.

Prints, as the median over rounds of each run's mean over its steps but the first (which pays for
start-up): the step time (``timing/step``), the rollout time, the CPU seconds the whole run's
process tree spent per step (``perf/run_cpu_s``: the figure to compare on a busy machine) and
their ratios to ``default``; and the disk the recorded batches take per step (the samples file
per step beside it, for scale).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runs import run_env  # noqa: E402

ROWS = {
    "default": (),
    "deterministic": ("rollout.max_running_requests=1",),
    "record": ("rollout.record=true",),
    "deterministic+record": ("rollout.max_running_requests=1", "rollout.record=true"),
}


def one_run(out: Path, steps: int, prompts: int, samples: int, extra: tuple[str, ...]) -> dict[str, float]:
    cmd = [sys.executable, "-m", "loongsage.cli", "train", "--config-name", "tiny/grpo",
           f"trainer.run_dir={out}", "logging.progress_bar=false", f"trainer.steps={steps}",
           "trainer.sft.steps=0", f"rollout.prompts_per_step={prompts}",
           f"rollout.n_samples_per_prompt={samples}", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, env=run_env())
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(extra) or 'default'} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    later = rows[1:] or rows
    cpu = statistics.mean(r["perf/run_cpu_s"] for r in later)
    batches = sum(p.stat().st_size for p in (out / "batches").glob("*")) if (out / "batches").is_dir() else 0
    saved = sum(p.stat().st_size for p in (out / "samples").glob("*"))
    return {"step_s": statistics.mean(r["timing/step"] for r in later),
            "rollout_s": statistics.mean(r["timing/rollout"] for r in later),
            "cpu_s": cpu,
            "recorded_kb_per_step": batches / 1024 / len(rows),
            "samples_kb_per_step": saved / 1024 / len(rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in ROWS}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for name, extra in ROWS.items():
                out = Path(tmp) / f"{name}-{round_}"
                runs[name].append(one_run(out, args.steps, args.prompts, args.samples, extra))
    results = {name: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
               for name, rows in runs.items()}
    base = results["default"]
    for row in results.values():
        row["step_ratio"] = row["step_s"] / base["step_s"]
        row["cpu_ratio"] = row["cpu_s"] / base["cpu_s"]
    if args.json:
        print(json.dumps({"steps": args.steps, "prompts": args.prompts, "samples": args.samples,
                          "rounds": args.rounds, "rows": results}))
        return
    print(f"tiny/grpo, {args.prompts} prompts x {args.samples} samples, {args.steps} steps, "
          f"median of {args.rounds} rounds")
    print(f"{'row':<22} {'step s':>7} {'ratio':>6} {'rollout s':>9} {'CPU s/step':>10} {'ratio':>6} "
          f"{'recorded KB/step':>16} {'samples KB/step':>15}")
    for name, r in results.items():
        print(f"{name:<22} {r['step_s']:>7.2f} {r['step_ratio']:>5.2f}x {r['rollout_s']:>9.2f} "
              f"{r['cpu_s']:>10.2f} {r['cpu_ratio']:>5.2f}x {r['recorded_kb_per_step']:>16.1f} "
              f"{r['samples_kb_per_step']:>15.1f}")


if __name__ == "__main__":
    main()
