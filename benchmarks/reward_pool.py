"""What running rewards in worker processes costs: the process hop per sample, and worker start-up.

Everything a run does per sample, side by side in one process, interleaved round by round:

* **in-process**: ``RewardCall`` (the one scoring function) called directly, and through
  ``asyncio.to_thread`` as rollouts scored before rewards ran in workers;
* **worker**: the same call through ``DeadlinePool.call`` (pickle the call, send it over a
  pipe, run it in a worker's main thread, send the result back).

Two rewards: ``constant`` (returns 1.0, so its column *is* the hop's overhead) and the
``math`` reward on a correct boxed answer (typical math-verify work). Each sample carries a
realistic ``Sample`` (80 prompt and 32 response tokens with logprobs) and ``Prompt`` in its
context, as in a run. Reported per reward: serial latency per call (one call at a time, the
overhead a sample adds), and per-sample time for one step's batch scored concurrently
(``--batch`` samples, the pool's ``--workers`` workers against threads that share the GIL).

Worker start-up, each start method in a fresh interpreter (the fork server is per process):
time from building the pool to the first math result, and the time a replacement worker
takes after a kill (a spinning call killed at its 0.5 s deadline, then a math call),
``forkserver`` with the reward module preloaded (what runs use) against plain ``forkserver``
and ``spawn``. (``fork`` is not measured: the controller holds torch, Ray and router
threads, which makes it unsafe.)

    .venv/bin/python benchmarks/reward_pool.py [--rounds 5] [--calls 200] [--batch 64] [--workers 2] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from loongsage import hookimpl
from loongsage.data.sources import RewardCall
from loongsage.data.types import Prompt, Sample
from loongsage.deadline.pool import CallFailed, DeadlinePool
from loongsage.plugins import load_plugins

MATH_MODULE = "loongsage_agents.rewards.math"


@dataclass
class ConstantParams:
    """No parameters worth the name: the reward returns 1.0."""

    score: float = 1.0


def constant_reward(sample_text, ground_truth, params, **context):
    return params.score


def spin() -> None:
    while True:
        pass


class BenchmarkRewards:
    @staticmethod
    @hookimpl
    def loongsage_register_rewards(register):
        register("constant", constant_reward, params=ConstantParams)


def reward_calls() -> dict[str, RewardCall]:
    registries = load_plugins(extra=[(BenchmarkRewards, "benchmark")])
    refs = {name: registries.resolve("reward", name, "data_sources[0].reward") for name in ("constant", "math")}
    return {name: RewardCall(ref, None, "bench") for name, ref in refs.items()}


FRESH = itertools.count(1000)  # every measured call scores a new answer: math-verify caches parses


def sample_args(i: int) -> tuple[tuple, dict]:
    prompt = Prompt("bench", i, [{"role": "user", "content": f"What is {i} + 3?"}], ground_truth=str(i + 3))
    sample = Sample(list(range(80)), list(range(32)), [-0.5] * 32, [0] * 32, [1] * 32,
                    text=f"{i} plus 3 is \\boxed{{{i + 3}}}", reward_info={"turns": 1})
    return (sample.text, prompt.ground_truth), {"prompt": prompt, "sample": sample}


async def serial(call: RewardCall, n: int, pool: DeadlinePool | None, threaded: bool) -> float:
    start = time.perf_counter()
    for _ in range(n):
        args, kwargs = sample_args(next(FRESH))
        if pool is not None:
            await pool.call(30.0, call, *args, **kwargs)
        elif threaded:
            await asyncio.to_thread(call, *args, **kwargs)
        else:
            call(*args, **kwargs)
    return (time.perf_counter() - start) / n


async def batch(call: RewardCall, n: int, pool: DeadlinePool | None) -> float:
    items = [sample_args(next(FRESH)) for _ in range(n)]
    start = time.perf_counter()
    if pool is not None:
        await asyncio.gather(*(pool.call(30.0, call, *a, **k) for a, k in items))
    else:
        await asyncio.gather(*(asyncio.to_thread(call, *a, **k) for a, k in items))
    return (time.perf_counter() - start) / n


def per_sample(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    calls = reward_calls()
    columns = ("direct", "to_thread", "worker", "batch_to_thread", "batch_worker")
    runs: dict[str, dict[str, list[float]]] = {name: {c: [] for c in columns} for name in calls}
    with DeadlinePool(args.workers, preload=[MATH_MODULE]) as pool:
        asyncio.run(pool.call(60.0, calls["math"], *sample_args(0)[0], **sample_args(0)[1]))  # workers up
        for name, call in calls.items():
            call(*sample_args(0)[0], **sample_args(0)[1])  # imports done on this side too
        for _ in range(args.rounds):
            for name, call in calls.items():
                n = args.calls if name == "constant" else max(20, args.calls // 4)
                runs[name]["direct"].append(asyncio.run(serial(call, n, None, False)))
                runs[name]["to_thread"].append(asyncio.run(serial(call, n, None, True)))
                runs[name]["worker"].append(asyncio.run(serial(call, n, pool, False)))
                runs[name]["batch_to_thread"].append(asyncio.run(batch(call, args.batch, None)))
                runs[name]["batch_worker"].append(asyncio.run(batch(call, args.batch, pool)))
    return {name: {c: statistics.median(v) * 1e3 for c, v in cols.items()} for name, cols in runs.items()}


def startup_child(method: str) -> dict[str, float]:
    """In a fresh interpreter: first result, and a replacement worker after a kill (ms)."""
    import pebble

    call = reward_calls()["math"]
    args, kwargs = sample_args(1)
    context = multiprocessing.get_context("spawn" if method == "spawn" else "forkserver")
    if method == "forkserver+preload":
        context.set_forkserver_preload([MATH_MODULE])
    start = time.perf_counter()
    pool = pebble.ProcessPool(1, context=context)
    pool.schedule(call, args, kwargs, timeout=60).result()
    first = time.perf_counter() - start
    try:
        pool.schedule(spin, timeout=0.5).result()
    except TimeoutError:
        pass
    start = time.perf_counter()
    pool.schedule(call, args, kwargs, timeout=60).result()
    replaced = time.perf_counter() - start
    pool.stop()
    pool.join()
    return {"first_result_ms": first * 1e3, "replacement_ms": replaced * 1e3}


def startup(rounds: int) -> dict[str, dict[str, float]]:
    methods = ("forkserver+preload", "forkserver", "spawn")
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
    for _ in range(rounds):
        for method in methods:
            out = subprocess.run([sys.executable, __file__, "--startup-child", method], capture_output=True,
                                 text=True, check=True)
            runs[method].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200, help="serial calls per round (math: a quarter, at least 20)")
    ap.add_argument("--batch", type=int, default=64, help="samples of one step scored concurrently")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--startup-rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--startup-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.startup_child:
        print(json.dumps(startup_child(args.startup_child)))
        return 0
    try:
        result = {"per_sample_ms": per_sample(args), "startup_ms": startup(args.startup_rounds),
                  "workers": args.workers, "batch": args.batch}
    except CallFailed as failure:
        print(f"a reward call failed: {failure}\n{failure.traceback_text}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"per sample, ms (median of {args.rounds} rounds; batch = {args.batch} samples at once, "
          f"{args.workers} workers)")
    print(f"{'reward':<10}{'direct':>9}{'to_thread':>11}{'worker':>9}{'hop':>9}"
          f"{'batch thread':>14}{'batch worker':>14}{'ratio':>8}")
    for name, row in result["per_sample_ms"].items():
        hop = row["worker"] - row["direct"]
        ratio = row["batch_worker"] / row["batch_to_thread"]
        print(f"{name:<10}{row['direct']:>9.3f}{row['to_thread']:>11.3f}{row['worker']:>9.3f}{hop:>9.3f}"
              f"{row['batch_to_thread']:>14.3f}{row['batch_worker']:>14.3f}{ratio:>7.2f}x")
    print(f"\nworker start-up, ms (median of {args.startup_rounds} fresh interpreters)")
    for method, row in result["startup_ms"].items():
        print(f"{method:<20} first result {row['first_result_ms']:>8.0f}   replacement after a kill "
              f"{row['replacement_ms']:>8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
