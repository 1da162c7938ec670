"""Step time of the synchronous and asynchronous schedules on a simulated long-tailed workload.

What this measures, honestly: the scheduler's overlap and waiting under a stated cost model,
with rollouts and training simulated by sleeps. No model runs, so CPU contention, memory
bandwidth and thread scaling do not enter: this is the trace-driven view,
not a CPU throughput claim. Real-compute numbers on this machine are issue 8's
``benchmarks/async_modes.py``.

Cost model (all knobs are flags):
  * response lengths: Pareto(alpha) * scale tokens, capped (a few very long samples);
  * decode: every running sample gains one token per decode step of ``--decode-ms`` on the
    whole rollout resource (memory-bound decode: the step time does not grow with the batch),
    so a group takes (its longest sample) x decode step;
  * training: ``--train-base-ms`` + ``--train-us-per-token`` per response token, on the whole
    train resource (the defaults make rollout about two thirds of a colocated step; when
    training dominates, a 50/50 split cannot win: see ``--split``);
  * resources at equal total (as LoongSage's Table 4: colocated on 16 GPUs vs 8 + 8):
    colocated rows get everything for each phase in turn; async rows give rollout the
    fraction ``--split`` and training the rest, each phase slowing down in proportion (perfect
    scaling assumed; real scaling is worse, which favours the colocated rows less than shown).

Rows (the five of LoongSage's Table 4, on one shared workload, side by side):
  colocated               S=0: dispatch B, wait for all, train, update
  colocated + partial     S=0, B/2 extra groups; at the boundary unfinished groups are aborted
                          and continue under the new weights
  async no_window S=2 / windowed_fifo S=2 / windowed_fifo S=3, with partial rollout (as
                          LoongSage's async rows, partial_ratio ~0.84). Our S is LoongSage's
                          stale_steps + 1: LoongSage frees a slot when the trainer takes a group,
                          so a token may lag S + 1 versions; ours frees it when the update is live
                          and guarantees a lag <= S (docs/async.md). Same dispatch room, hard bound.

    .venv/bin/python benchmarks/async_runtime.py [--steps 12] [--batch 8] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Optional

from loongsage.data.types import Group, Prompt, Sample
from loongsage.runtime.async_scheduler import AsyncScheduler
from loongsage.plugins import load_plugins
from loongsage.runtime.scheduler import build_window_policy


@dataclass(frozen=True)
class Row:
    label: str
    policy: str
    stale_steps: int
    colocated: bool
    partial: bool = False
    oversample_frac: float = 0.0


ROWS = (
    Row("colocated", "no_window", 0, True),
    Row("colocated + partial", "no_window", 0, True, partial=True, oversample_frac=0.5),
    Row("async no_window S=2", "no_window", 2, False, partial=True),
    Row("async windowed_fifo S=2", "windowed_fifo", 2, False, partial=True),
    Row("async windowed_fifo S=3", "windowed_fifo", 3, False, partial=True),
)


class Prompts:
    """One shared workload: prompt i always has the same response lengths in every row."""

    def __init__(self) -> None:
        self.drawn = 0

    def next_prompt(self) -> Prompt:
        self.drawn += 1
        return Prompt("bench", self.drawn - 1, [])


class SimRollout:
    """Sleeps the decode time of each sample; abortable at a weight update."""

    def __init__(self, args: argparse.Namespace, speed: float) -> None:
        self.args = args
        self.step_s = args.decode_ms / 1000 / speed
        self._gen = 0

    def lengths(self, prompt: Prompt) -> list[int]:
        rng = random.Random(prompt.index * 7919 + self.args.seed)
        a = self.args
        return [min(a.max_tokens, int(a.scale * rng.paretovariate(a.alpha))) for _ in range(a.group_size)]

    async def __call__(self, prompt: Prompt, group_id: int, version: int, resume_from: Optional[Group] = None) -> Group:
        targets = self.lengths(prompt)
        samples = resume_from.samples if resume_from else [Sample([0], [], [], [], [], "abort") for _ in targets]
        gen = self._gen
        while self._gen == gen and any(len(s.response_ids) < t for s, t in zip(samples, targets)):
            await asyncio.sleep(self.step_s * 4)  # four decode steps per wake-up
            for s, t in zip(samples, targets):
                for _ in range(min(4, t - len(s.response_ids))):
                    s.response_ids.append(1)
                    s.response_logprobs.append(0.0)
                    s.weight_versions.append(version)
                    s.loss_mask.append(1)
        for s, t in zip(samples, targets):
            s.finish_reason = "stop" if len(s.response_ids) >= t else "abort"
        return Group(group_id, prompt, samples, version)

    async def abort_all(self) -> None:
        self._gen += 1


def run_row(row: Row, args: argparse.Namespace) -> dict:
    rollout_speed = 1.0 if row.colocated else args.split
    train_speed = 1.0 if row.colocated else 1.0 - args.split
    rollout = SimRollout(args, rollout_speed)
    policy = load_plugins().resolve("window_policy", row.policy, "async.window_policy")
    sched = AsyncScheduler(
        build_window_policy(policy), Prompts(), rollout, args.batch, row.stale_steps,
        oversample=int(args.batch * row.oversample_frac), partial=row.partial,
        abort_inflight=rollout.abort_all if row.partial else None,
    )
    steps, metrics = [], []
    try:
        for step in range(args.steps):
            start = time.perf_counter()
            batch = sched.next_batch(step)
            if row.colocated:
                sched.pause()  # the rollout resource is about to train: stop generating
            tokens = sum(len(s.response_ids) for g in batch for s in g.samples)
            time.sleep((args.train_base_ms + args.train_us_per_token * tokens / 1000) / 1000 / train_speed)
            if not row.colocated:
                sched.pause()
            sched.on_weights_updated(step + 1)
            steps.append(time.perf_counter() - start)
            metrics.append(sched.metrics())
    finally:
        sched.close()

    def mean(key: str) -> float:
        return statistics.fmean(m[key] for m in metrics)

    return {
        "row": row.label,
        "step_s": statistics.fmean(steps),
        "step_s_excl_first": statistics.fmean(steps[1:]) if len(steps) > 1 else steps[0],
        "staleness_mean": mean("async/staleness_mean"),
        "staleness_max": max(m["async/staleness_max"] for m in metrics),
        "partial_ratio": mean("rollout/partial_ratio"),
        "length_bias": metrics[-1]["rollout/length_bias"],  # cumulative: the run's value
        "trainer_wait_s": mean("perf/trainer_wait_s"),
        "rollout_wait_s": mean("perf/rollout_wait_s"),
    }


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=8, help="prompt groups per step (B)")
    p.add_argument("--group-size", type=int, default=4, help="samples per group (G)")
    p.add_argument("--alpha", type=float, default=1.3, help="Pareto tail index of response lengths")
    p.add_argument("--scale", type=float, default=24.0, help="Pareto scale (tokens)")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--decode-ms", type=float, default=0.25, help="one decode step on the whole rollout resource")
    p.add_argument("--train-base-ms", type=float, default=20.0)
    p.add_argument("--train-us-per-token", type=float, default=15.0)
    p.add_argument("--split", type=float, default=0.5, help="async: rollout's share of the resources")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if not 0.0 < args.split < 1.0:
        p.error(f"--split: expected a fraction in (0, 1), got {args.split}")

    results = [run_row(row, args) for row in ROWS]
    base = results[0]["step_s"]
    for r in results:
        r["speedup"] = base / r["step_s"]
    if args.json:
        print(json.dumps({"benchmark": "async_runtime", "simulated": True, "args": vars(args), "rows": results}))
        return 0
    print(f"simulated workload: B={args.batch} G={args.group_size}, lengths Pareto(alpha={args.alpha}) x "
          f"{args.scale} capped at {args.max_tokens}, decode step {args.decode_ms} ms, async split "
          f"{args.split:.2f} rollout / {1 - args.split:.2f} train, {args.steps} steps")
    head = f"{'config':26s} {'step s':>8s} {'speedup':>8s} {'excl.1st':>9s} {'stale':>6s} {'max':>4s} " \
           f"{'partial':>8s} {'len bias':>9s} {'trainer wait':>13s} {'rollout idle':>13s}"
    print(head)
    print("-" * len(head))
    for r in results:
        print(f"{r['row']:26s} {r['step_s']:8.3f} {r['speedup']:7.2f}x {r['step_s_excl_first']:9.3f} "
              f"{r['staleness_mean']:6.2f} {r['staleness_max']:4.0f} {r['partial_ratio']:8.2f} "
              f"{r['length_bias']:9.2f} {r['trainer_wait_s']:12.3f}s {r['rollout_wait_s']:12.3f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
