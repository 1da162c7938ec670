"""The AgentFlow router's added latency and throughput vs calling the engine directly.

Both sides run the same requests against the same real embedded engine (tiny model, greedy,
``--new-tokens`` new tokens) on loopback, side by side in one run, at each concurrency level.
The engine and the router each run in a process of their own (as deployed), the load
generator in this one:

* **direct**: each session sends the chat-template token ids of its conversation with
  ``EngineClient.agenerate`` (what a white-box loop without a router would do);
* **router**: each session POSTs the same conversation to the router's
  ``/{trajectory}/0/v1/chat/completions`` under its own trajectory (raw ``httpx`` clients as
  many and as large as ``EngineClient``'s pools, so client-side costs match), so the
  router parses, matches history, renders, tokenizes, calls the engine, parses tool calls,
  records the turn and answers in the Chat Completions format;
* **proxy**: the direct side's requests through a bare forwarding proxy in a process of its own,
  on the same server stack as the router (uvicorn on asyncio's loop, httptools, Starlette) and
  the router's connection pools to the engine (``EngineClient``'s): it reads each ``/generate``
  body and sends it on unchanged.
  Its added latency is the floor of any router that runs in a process of its own on this
  machine: one more HTTP hop, parsed and encoded twice more, on the cores the engine uses.

Reported per level (median over ``--rounds``, the two sides interleaved round by round):
request latency p50/p99 of each side, the router's added p50/p99 (router minus direct), the
bare hop's (proxy minus direct) and requests/s of each; and CPU milliseconds per turn (each process's CPU time around the round, over
the round's turns; ``cpu_s``): the router process's, the engine process's on each side,
and the load generator's own on each side, so the router's cost shows as CPU as well as time. Greedy decoding on identical token ids makes both sides generate the same
tokens, so the difference is the router's cost, not the model's. The engine, the router and
the load generator share this machine's cores: absolute numbers depend on the load around them.

    .venv/bin/python benchmarks/router.py [--levels 1,64,512] [--rounds 3] [--new-tokens 8] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any


def cpu_s(pid: int | None = None) -> float:
    """CPU seconds of process ``pid``'s live threads so far (this process's when None), from
    each thread's ``/proc/<pid>/task/<tid>/schedstat`` run time in nanoseconds: ``/proc/<pid>/stat``
    counts 10 ms ticks, too coarse for a round of 64 turns of 2 ms each."""
    if pid is None:
        return time.process_time()
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except FileNotFoundError:  # the thread ended between the listing and the read
            pass
    return total / 1e9


def measured(run, pids: dict[str, int | None], turns: int) -> tuple[list[float], float, dict[str, float]]:
    """``run()``'s latencies and wall time, and each process's CPU ms per turn while it ran."""
    before = {name: cpu_s(pid) for name, pid in pids.items()}
    lat, wall = asyncio.run(run())
    return lat, wall, {name: (cpu_s(pid) - before[name]) * 1e3 / turns for name, pid in pids.items()}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def conversation(i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": f"Session {i}: what is {i} plus {i + 1}?"}]


async def run_direct(client, tokenizer, n: int, new_tokens: int) -> tuple[list[float], float]:
    prompts = [tokenizer.apply_chat_template(conversation(i), tokenize=True, add_generation_prompt=True)
               for i in range(n)]
    prompts = [list(p["input_ids"]) if hasattr(p, "keys") else list(p) for p in prompts]
    params = {"max_new_tokens": new_tokens, "temperature": 0.0}

    async def one(ids):
        t0 = time.perf_counter()
        await client.agenerate(ids, params)
        return time.perf_counter() - t0

    start = time.perf_counter()
    lat = await asyncio.gather(*(one(p) for p in prompts))
    return list(lat), time.perf_counter() - start


async def run_router(router, n: int, new_tokens: int, tag: str, tls: Any) -> tuple[list[float], float]:
    import httpx

    from loongsage.engines.client import POOL_SHARDS

    ids = [f"{tag}-{i}" for i in range(n)]
    for tid in ids:
        router.open_trajectory(tid)
    # raw HTTP clients as many and as large as EngineClient's pools on the direct side (httpx's
    # default limits, POOL_SHARDS of them taken in turn, one TLS context made once), so
    # client-side costs match and the difference is the router's
    shards = [httpx.AsyncClient(timeout=None, verify=tls) for _ in range(POOL_SHARDS)]

    async def one(i):
        body = {"model": "policy", "messages": conversation(i), "max_tokens": new_tokens,
                "temperature": 0}
        t0 = time.perf_counter()
        resp = await shards[i % POOL_SHARDS].post(router.base_urls(ids[i])["openai"] + "/chat/completions",
                                                  json=body)
        resp.raise_for_status()
        return time.perf_counter() - t0

    try:
        start = time.perf_counter()
        lat = await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.perf_counter() - start
    finally:
        for http in shards:
            await http.aclose()
    for tid in ids:
        router.finish_trajectory(tid)
    return list(lat), wall


ENGINE = """
import sys, threading
from loongsage.engines.embedded_rollout.engine import EmbeddedRolloutEngine
engine = EmbeddedRolloutEngine(sys.argv[1], max_running_requests=64, num_threads=1)
print(engine.start(), flush=True)
threading.Event().wait()
"""

ROUTER = """
import sys, threading
from transformers import AutoTokenizer
from loongsage.agentflow.server import Router
from loongsage.agentflow.settings import RouterSettings
from loongsage.config.router_plugins import resolve_router_plugins
from loongsage.engines.client import EngineClient
from loongsage.plugins import load_plugins
settings = RouterSettings(auto_create_trajectories=True).with_plugins(resolve_router_plugins(load_plugins()))
router = Router([EngineClient(sys.argv[2])], AutoTokenizer.from_pretrained(sys.argv[1]), settings)
print(router.start(), flush=True)
threading.Event().wait()
"""

PROXY = """
import sys, threading
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
from loongsage.engines.client import EngineClient
from loongsage.http_thread import ThreadedServer
engine = EngineClient(sys.argv[1], timeout=None)
async def forward(request):
    resp = await engine._aclient().post("/generate", content=await request.body(),
                                        headers={"content-type": "application/json"})
    return Response(resp.content, resp.status_code, media_type="application/json")
app = Starlette(routes=[Route("/generate", forward, methods=["POST"])])
print(ThreadedServer(app, name="proxy", lifespan="off").start(), flush=True)
threading.Event().wait()
"""


def spawn(code: str, *argv: str) -> tuple[subprocess.Popen, str]:
    """Run ``code`` in its own process (its own GIL, as in a deployment); returns its URL."""
    proc = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    url = proc.stdout.readline().strip()
    if not url.startswith("http"):
        proc.kill()
        raise RuntimeError(f"benchmark helper process failed to start: {url!r}")
    return proc, url


class RemoteRouter:
    """The router process, seen from the load generator: trajectories open on first use."""

    def __init__(self, url: str) -> None:
        self.url = url

    def open_trajectory(self, tid: str) -> None:
        return None

    def finish_trajectory(self, tid: str) -> None:
        return None

    def base_urls(self, tid: str) -> dict[str, str]:
        return {"openai": f"{self.url}/{tid}/0/v1"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,64,512")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import httpx
    from transformers import AutoTokenizer

    from loongsage.engines.client import EngineClient
    from loongsage.models.tiny import ensure_tiny_model

    model_dir = str(ensure_tiny_model())
    engine_proc, url = spawn(ENGINE, model_dir)
    router_proc, router_url = spawn(ROUTER, model_dir, url)
    proxy_proc, proxy_url = spawn(PROXY, url)
    router = RemoteRouter(router_url)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    direct_client = EngineClient(url, timeout=None)
    tls = httpx.create_ssl_context()  # made once, as EngineClient does
    proxy_client = EngineClient(proxy_url, timeout=None)
    rows = []
    try:
        asyncio.run(run_direct(direct_client, tokenizer, 2, args.new_tokens))  # warm-up
        asyncio.run(run_direct(proxy_client, tokenizer, 2, args.new_tokens))
        asyncio.run(run_router(router, 2, args.new_tokens, "warmup", tls))
        for level in (int(x) for x in args.levels.split(",")):
            per = {"direct": [], "proxy": [], "router": []}
            pids = {"engine": engine_proc.pid, "client": None}
            for r in range(args.rounds):
                per["direct"].append(measured(
                    lambda: run_direct(direct_client, tokenizer, level, args.new_tokens), pids, level))
                per["proxy"].append(measured(
                    lambda: run_direct(proxy_client, tokenizer, level, args.new_tokens),
                    {**pids, "proxy": proxy_proc.pid}, level))
                per["router"].append(measured(
                    lambda: run_router(router, level, args.new_tokens, f"l{level}r{r}", tls),
                    {**pids, "router": router_proc.pid}, level))
            row = {"sessions": level}
            for side, runs in per.items():
                row[f"{side}_p50_ms"] = statistics.median(percentile(lat, 0.5) for lat, _, _ in runs) * 1e3
                row[f"{side}_p99_ms"] = statistics.median(percentile(lat, 0.99) for lat, _, _ in runs) * 1e3
                row[f"{side}_rps"] = statistics.median(level / wall for _, wall, _ in runs)
                for name in runs[0][2]:
                    row[f"{side}_{name}_cpu_ms_per_turn"] = statistics.median(cpu[name] for _, _, cpu in runs)
            row["added_p50_ms"] = row["router_p50_ms"] - row["direct_p50_ms"]
            row["added_p99_ms"] = row["router_p99_ms"] - row["direct_p99_ms"]
            row["hop_added_p50_ms"] = row["proxy_p50_ms"] - row["direct_p50_ms"]
            row["rps_ratio"] = row["router_rps"] / row["direct_rps"]
            rows.append(row)
    finally:
        for proc in (proxy_proc, router_proc, engine_proc):
            proc.kill()
            proc.wait()
    if args.json:
        print(json.dumps({"benchmark": "router", "new_tokens": args.new_tokens, "rounds": args.rounds,
                          "rows": rows}))
        return
    head = (f"{'sessions':>8} | {'direct p50':>10} {'p99':>8} {'req/s':>8} | {'router p50':>10} {'p99':>8} "
            f"{'req/s':>8} | {'added p50':>9} {'p99':>8} | {'req/s ratio':>11} | {'bare hop p50':>12} {'added':>7}")
    print(f"AgentFlow router vs direct engine calls (tiny model, greedy, {args.new_tokens} new tokens, "
          f"median of {args.rounds} rounds; ms)")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['sessions']:>8} | {r['direct_p50_ms']:>10.1f} {r['direct_p99_ms']:>8.1f} {r['direct_rps']:>8.1f} | "
              f"{r['router_p50_ms']:>10.1f} {r['router_p99_ms']:>8.1f} {r['router_rps']:>8.1f} | "
              f"{r['added_p50_ms']:>9.1f} {r['added_p99_ms']:>8.1f} | {r['rps_ratio']:>11.2f} | "
              f"{r['proxy_p50_ms']:>12.1f} {r['hop_added_p50_ms']:>7.1f}")
    print("\nCPU ms per turn (median of the rounds)")
    head = (f"{'sessions':>8} | {'direct: engine':>14} {'client':>7} | {'router: router':>14} {'engine':>7} "
            f"{'client':>7} | {'proxy: proxy':>12} {'engine':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['sessions']:>8} | {r['direct_engine_cpu_ms_per_turn']:>14.2f} {r['direct_client_cpu_ms_per_turn']:>7.2f} | "
              f"{r['router_router_cpu_ms_per_turn']:>14.2f} {r['router_engine_cpu_ms_per_turn']:>7.2f} "
              f"{r['router_client_cpu_ms_per_turn']:>7.2f} | {r['proxy_proxy_cpu_ms_per_turn']:>12.2f} "
              f"{r['proxy_engine_cpu_ms_per_turn']:>7.2f}")


if __name__ == "__main__":
    main()
