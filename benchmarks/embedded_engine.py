"""Output tokens/s of the embedded rollout engine vs transformers' static-batch ``generate``.

Workload: ``--requests`` prompts (8–40 tokens; ``--group-size`` requests
share each prompt, as an RL group's samples do) whose response lengths are
long-tailed, from 8 to 118 new tokens (most short, a few long), sampled at temperature 1 with
EOS ignored so every request produces exactly its length. Both sides run the same prompts
with the same torch thread count, interleaved round by round, in one process:

* **baseline**: one left-padded ``model.generate`` over all requests with
  ``max_new_tokens`` = the longest length; a request's useful tokens are its first n, the
  rest is what static batching wastes on a long-tailed batch;
* **embedded**: all requests sent at once over HTTP (``EngineClient.agenerate`` against a real
  loopback server), each with its own ``max_new_tokens``; finished rows leave the batch;
* **embedded, no HTTP**: the same requests handed straight to the engine's decode loop, to
  show what the HTTP layer costs.

Reported: useful output tokens per wall-clock second (median over ``--rounds``, rows
interleaved) and their ratio; the embedded figure includes HTTP and JSON overhead, the
baseline has none. Also tokens per CPU-second of this process (all its threads): on a
shared, oversubscribed machine wall-clock swings with other people's load, CPU time much less.
Both sides wait on OpenMP as ``loongsage train`` does (``loongsage.engines.openmp_wait``: a
short spin, unless ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is set); CPU time counts the spin.

    .venv/bin/python benchmarks/embedded_engine.py [--model tiny|smollm2] [--requests 32]
        [--group-size 8] [--rounds 3] [--threads N] [--json]

The hit rate of the engine's shared prefill (identical prompts admitted together are
prefilled once) is printed: the share of prefilled prompt tokens that were not recomputed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import threading
import time

from loongsage.engines.openmp_wait import openmp_wait_env  # torch-free: set before torch loads

os.environ.update(openmp_wait_env(os.environ))  # as `loongsage train` does; read at torch import

import torch  # noqa: E402


def workload(n: int, seed: int, vocab: int, group: int = 1) -> tuple[list[list[int]], list[int]]:
    """``n`` requests: ``n / group`` distinct prompts, each asked ``group`` times (an RL group)."""
    rng = random.Random(seed)
    distinct = [[rng.randrange(3, vocab) for _ in range(rng.randint(8, 40))] for _ in range(-(-n // group))]
    prompts = [distinct[i // group] for i in range(n)]
    # long tail: n_i = 8 + 110 * u^3 for evenly spaced u, shuffled (median ~22, max 118)
    lengths = [8 + round(110 * (i / max(n - 1, 1)) ** 3) for i in range(n)]
    rng.shuffle(lengths)
    return prompts, lengths


def run_baseline(model, prompts: list[list[int]], lengths: list[int]) -> float:
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max(lengths), do_sample=True,
                             temperature=1.0, top_p=1.0, top_k=0, eos_token_id=None, pad_token_id=0)
    elapsed = time.perf_counter() - start
    assert out.shape[1] - width == max(lengths)
    return elapsed


def run_embedded(client, prompts: list[list[int]], lengths: list[int]) -> float:
    async def go():
        return await asyncio.gather(*[
            client.agenerate(p, {"max_new_tokens": n, "temperature": 1.0, "ignore_eos": True})
            for p, n in zip(prompts, lengths)
        ])

    start = time.perf_counter()
    outs = asyncio.run(go())
    elapsed = time.perf_counter() - start
    assert [len(o.output_ids) for o in outs] == lengths
    return elapsed


def run_direct(engine, prompts: list[list[int]], lengths: list[int]) -> float:
    """The same requests handed straight to the decode loop: the engine without HTTP."""
    from loongsage.engines.embedded_rollout.params import SamplingParams
    from loongsage.engines.embedded_rollout.scheduler import Request

    done = threading.Semaphore(0)
    reqs = [Request(f"direct-{i}", p, SamplingParams(max_new_tokens=n, ignore_eos=True),
                    on_update=lambda _n, finished: finished and done.release())
            for i, (p, n) in enumerate(zip(prompts, lengths))]
    start = time.perf_counter()
    for r in reqs:
        engine.scheduler.submit(r)
    for _ in reqs:
        done.acquire()
    elapsed = time.perf_counter() - start
    assert [len(r.output_ids) for r in reqs] == lengths
    return elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--group-size", type=int, default=8, help="samples per prompt (RL groups; 1: all distinct)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args(argv)

    from transformers import AutoModelForCausalLM

    from loongsage.engines.client import EngineClient
    from loongsage.engines.embedded_rollout import EmbeddedRolloutEngine

    if args.model == "tiny":
        from loongsage.models.tiny import ensure_tiny_model as ensure
    else:
        from loongsage.models.smollm2 import ensure_smollm2 as ensure
    path = str(ensure())
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    engine = EmbeddedRolloutEngine(path, max_running_requests=max(64, args.requests),
                                   num_threads=threads, seed=args.seed)
    url = engine.start()
    client = EngineClient(url, timeout=3600)
    prompts, lengths = workload(args.requests, args.seed, model.config.vocab_size, args.group_size)
    useful = sum(lengths)
    rows = {"HF generate, static batch": lambda: run_baseline(model, prompts, lengths),
            "embedded engine over HTTP": lambda: run_embedded(client, prompts, lengths),
            "embedded engine, no HTTP": lambda: run_direct(engine, prompts, lengths)}
    wall: dict[str, list[float]] = {k: [] for k in rows}
    cpu: dict[str, list[float]] = {k: [] for k in rows}
    try:
        warm = slice(0, min(4, args.requests))
        run_baseline(model, prompts[warm], [8] * len(prompts[warm]))
        run_embedded(client, prompts[warm], [8] * len(prompts[warm]))
        for _ in range(args.rounds):  # interleaved, so background load hits all rows alike
            for name, fn in rows.items():
                c0 = time.process_time()
                wall[name].append(fn())
                cpu[name].append(time.process_time() - c0)
        stats = engine.scheduler.stats
        shared_prefill = stats["prefill_tokens_shared"] / max(stats["prefill_tokens"], 1)
    finally:
        client.close()
        engine.stop()
    tps = {k: useful / statistics.median(v) for k, v in wall.items()}
    tpc = {k: useful / statistics.median(v) for k, v in cpu.items()}
    base, http, direct = rows
    result = {
        "benchmark": "embedded_engine",
        "model": args.model,
        "requests": args.requests, "group_size": args.group_size,
        "shared_prefill_hit_rate": round(shared_prefill, 3),
        "new_tokens_min": min(lengths), "new_tokens_median": statistics.median(lengths),
        "new_tokens_max": max(lengths), "useful_tokens": useful,
        "threads": threads, "rounds": args.rounds,
        "baseline_hf_generate_tok_s": round(tps[base], 1),
        "embedded_engine_tok_s": round(tps[http], 1),
        "ratio": round(tps[http] / tps[base], 2),
        "embedded_no_http_tok_s": round(tps[direct], 1),
        "ratio_no_http": round(tps[direct] / tps[base], 2),
        "ratio_per_cpu_second": round(tpc[http] / tpc[base], 2),
        "wall_seconds": {k: [round(t, 3) for t in v] for k, v in wall.items()},
        "cpu_seconds": {k: [round(t, 3) for t in v] for k, v in cpu.items()},
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"embedded engine vs HF generate (static batch) | model={args.model} "
          f"requests={args.requests} new tokens {min(lengths)}-{max(lengths)} "
          f"(median {statistics.median(lengths)}) | groups of {args.group_size} | threads={threads} "
          f"rounds={args.rounds}")
    print(f"{'':<28}{'wall s':>9}{'tok/s':>10}{'CPU s':>9}{'tok/CPU-s':>11}")
    for k in rows:
        print(f"{k:<28}{statistics.median(wall[k]):>9.3f}{tps[k]:>10.1f}"
              f"{statistics.median(cpu[k]):>9.3f}{tpc[k]:>11.1f}")
    print(f"ratio embedded (HTTP) / HF generate: {tps[http] / tps[base]:.2f}x wall-clock, "
          f"{tpc[http] / tpc[base]:.2f}x per CPU-second "
          f"(no HTTP: {tps[direct] / tps[base]:.2f}x wall-clock)")
    print(f"shared-prefill hit rate: {shared_prefill:.1%} of prefilled prompt tokens not recomputed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
