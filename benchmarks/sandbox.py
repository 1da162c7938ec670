"""Sandbox latency and throughput: ``bwrap`` against the ``process`` backend as the baseline.

Two measurements per backend, interleaved round by round in one process so both see the
same machine load:

* **lifecycle**: create a sandbox, run ``true`` in it, close it; latency p50/p99 over
  ``--iterations`` (what an un-pooled reward pays per sample);
* **pooled**: ``--trajectories`` trajectories, ``--concurrency`` at a time, each acquiring a
  sandbox from a pre-warmed ``SandboxPool`` (size = concurrency), running ``--execs`` commands
  (``true``) and releasing it (which resets it); reported as execs/s, with the reset cost
  included. Pool warm-up is excluded.

``process`` runs trusted commands only (it is not a security boundary); it is the floor a
real isolation layer is measured against. The ``bwrap`` column shows what namespaces
cost at creation and how much of it the pool hides.

    .venv/bin/python benchmarks/sandbox.py [--iterations 40] [--trajectories 40]
        [--execs 4] [--concurrency 2] [--rounds 2] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import time

from loongsage.plugins import load_plugins
from loongsage_sandbox.pool import SandboxPool

REGISTRIES = load_plugins()

BACKENDS = ("process", "bwrap")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


async def lifecycle(backend: str, n: int) -> list[float]:
    cls = REGISTRIES.sandbox.get(backend)
    out = []
    for _ in range(n):
        start = time.perf_counter()
        async with cls(untrusted=False) as sb:
            result = await sb.exec(["true"])
        out.append(time.perf_counter() - start)
        if result.exit_code != 0:
            raise RuntimeError(f"{backend}: 'true' failed: {result}")
    return out


async def pooled(backend: str, trajectories: int, execs: int, concurrency: int) -> float:
    cls = REGISTRIES.sandbox.get(backend)
    async with SandboxPool(cls, None, size=concurrency, max_size=concurrency, untrusted=False) as pool:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for t in range(trajectories):
            queue.put_nowait(t)

        async def worker() -> None:
            while not queue.empty():
                t = queue.get_nowait()
                async with pool.session(f"traj-{t}") as sb:
                    for _ in range(execs):
                        if (await sb.exec(["true"])).exit_code != 0:
                            raise RuntimeError(f"{backend}: 'true' failed")

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return trajectories * execs / elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=40, help="create+exec+close samples per round")
    ap.add_argument("--trajectories", type=int, default=40, help="pooled trajectories per round")
    ap.add_argument("--execs", type=int, default=4, help="commands per trajectory")
    ap.add_argument("--concurrency", type=int, default=2, help="trajectories in flight (= pool size)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args(argv)
    backends = [b for b in BACKENDS if b != "bwrap" or shutil.which("bwrap")]
    if "bwrap" not in backends:
        print("bubblewrap is not installed (apt-get install -y bubblewrap); measuring process only",
              file=sys.stderr)
    latencies: dict[str, list[float]] = {b: [] for b in backends}
    rates: dict[str, list[float]] = {b: [] for b in backends}
    for _ in range(args.rounds):
        for b in backends:
            latencies[b] += asyncio.run(lifecycle(b, args.iterations))
            rates[b].append(asyncio.run(pooled(b, args.trajectories, args.execs, args.concurrency)))
    result: dict[str, object] = {"config": vars(args) | {"json": None}, "backends": {}}
    for b in backends:
        result["backends"][b] = {
            "lifecycle_p50_ms": 1000 * percentile(latencies[b], 0.5),
            "lifecycle_p99_ms": 1000 * percentile(latencies[b], 0.99),
            "pooled_execs_per_s": statistics.median(rates[b]),
        }
    stats = result["backends"]
    if "bwrap" in stats:
        base, bw = stats["process"], stats["bwrap"]
        result["bwrap_vs_process"] = {
            "lifecycle_p50_ratio": bw["lifecycle_p50_ms"] / base["lifecycle_p50_ms"],
            "pooled_execs_per_s_ratio": bw["pooled_execs_per_s"] / base["pooled_execs_per_s"],
            "bwrap_pooled_exec_vs_lifecycle_speedup": (bw["pooled_execs_per_s"] * bw["lifecycle_p50_ms"] / 1000),
        }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{'backend':<10} {'create+exec+close p50':>22} {'p99':>10} {'pooled execs/s':>16}")
    for b in backends:
        s = stats[b]
        print(f"{b:<10} {s['lifecycle_p50_ms']:>19.1f} ms {s['lifecycle_p99_ms']:>7.1f} ms "
              f"{s['pooled_execs_per_s']:>16.0f}")
    if "bwrap_vs_process" in result:
        r = result["bwrap_vs_process"]
        print(f"\nbwrap / process: lifecycle p50 x{r['lifecycle_p50_ratio']:.2f}, "
              f"pooled execs/s x{r['pooled_execs_per_s_ratio']:.2f}; "
              f"with the pool, bwrap runs {r['bwrap_pooled_exec_vs_lifecycle_speedup']:.1f}x more commands/s "
              f"than creating a sandbox per command")
    return 0


if __name__ == "__main__":
    sys.exit(main())
