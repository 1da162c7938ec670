"""The agentic rollout phase with the embedded engine's prefix cache on and off, side by side.

For each ``--recipe`` (``tiny/code_repair``, ``smollm2/tool_calculator``...) the rollout phase
of one step runs twice, cache off then on, each in a process of its own (so each has its own
peak memory): the recipe's data source and agent (real multi-turn ``tool_loop`` trajectories:
openai SDK -> the AgentFlow router -> the engine pool -> a real embedded engine over HTTP,
tools in the recipe's bubblewrap sandbox), the same prompts and seeds (the group seed as
``RolloutManager`` derives it), nothing scored or trained. ``--model RECIPE=DIR`` replaces the
recipe's model: a warm start (``loongsage sft --config-name tiny/code_repair``; the untrained tiny model
writes no tool calls, so its trajectories would be single-turn).

Reported per side: prompt tokens submitted (every request's prompt, as the engine received
it), prefill tokens computed (the engine's prefill forward tokens: submitted minus those taken
from the prefix cache or shared with an identical prompt of the same batch), their ratio,
the trajectories' unique tokens (distinct prefixes over all trajectories: a group's shared
prompt once) and computed / unique, the rollout phase's wall seconds and CPU seconds (this
process, the engine and router threads included, plus its waited-for children, the sandboxes)
and peak resident memory. Across the sides: the largest |log-prob difference| of the sampled
tokens of trajectories whose tokens agree, and how many trajectories' tokens differ.

``--json`` prints the per-recipe rows under ``recipes`` and, at the top level, the worst over
the recipes: ``prefill_ratio_on``, ``prefill_ratio_off`` (computed / submitted), ``rollout_time_ratio``
(on / off) and ``max_logprob_diff``.

    .venv/bin/python benchmarks/agentic_rollout.py --recipe tiny/code_repair --model tiny/code_repair=DIR \
        [--prompts 4] [--samples 4] [--max-new-tokens 64] [--threads 1] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def unique_tokens(sequences: list[list[int]]) -> int:
    """Distinct prefixes over ``sequences``: the nodes of the token trie they span."""
    root: dict[int, dict] = {}
    count = 0
    for seq in sequences:
        node = root
        for tok in seq:
            if tok not in node:
                node[tok] = {}
                count += 1
            node = node[tok]
    return count


def one_side(args: argparse.Namespace) -> dict[str, Any]:
    """The rollout phase of ``args.recipe`` with ``args.cache_gb`` of prefix cache, in this process."""
    from transformers import AutoTokenizer

    from loongsage.agentflow.settings import RouterSettings
    from loongsage.config.compose import load_config
    from loongsage.controller.agent_routers import AgentRouters
    from loongsage.controller.build import sampling_params
    from loongsage.data.sources import build_sources, training_sources
    from loongsage.engines.client import EngineClient
    from loongsage.engines.embedded_rollout import EmbeddedRolloutEngine
    from loongsage.engines.pool import EnginePool
    from loongsage.engines.sampling_seed import SEED_KEY, derive_seed
    from loongsage.models.resolve import resolve_model_path
    from loongsage.runtime.event_loop import EventLoopThread

    overrides = [f"rollout.n_samples_per_prompt={args.samples}", f"rollout.max_new_tokens={args.max_new_tokens}"]
    if args.model:
        overrides.append(f"model.path={args.model[0]}")
    spec = load_config(args.recipe, overrides)
    cfg = spec.cfg
    path = str(resolve_model_path(cfg.model.path))
    tokenizer = AutoTokenizer.from_pretrained(path)
    sources = build_sources(spec.sources, spec.registries, cfg.trainer.seed, tokenizer)
    source = next(iter(training_sources(sources).values()))
    engine = EmbeddedRolloutEngine(path, seed=cfg.trainer.seed, num_threads=args.threads,
                                   max_running_requests=cfg.rollout.max_running_requests,
                                   prefix_cache_gb=args.cache_gb)
    engine.start()
    pool = EnginePool([EngineClient(engine.url, timeout=None)])
    loop = EventLoopThread()
    with tempfile.TemporaryDirectory() as run_dir:
        routers = AgentRouters(sources, pool, tokenizer, RouterSettings.from_config(cfg.agentflow, spec.router),
                               Path(run_dir))
        try:
            params = {**sampling_params(cfg, tokenizer), **source.sampling}
            prompts = [source.get(i) for i in range(args.prompts)]

            async def phase():
                return await asyncio.gather(*(source.agent.run_group(
                    p, args.samples, pool, {**params, SEED_KEY: derive_seed(cfg.trainer.seed, 0, p.source, p.index, 1)})
                    for p in prompts))

            cpu0, t0 = cpu_seconds(), time.perf_counter()
            groups = loop.run(phase())
            seconds, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
        finally:
            routers.close()
            loop.close()
    stats = engine.scheduler.load()
    engine.stop()
    samples = [s for group in groups for s in group]
    submitted, cached = pool.take_prompt_usage()
    computed = stats["prefill_tokens"] - stats["prefill_tokens_shared"] - stats["prefill_tokens_cached"]
    unique = unique_tokens([s.prompt_ids + s.response_ids for s in samples])
    return {
        "submitted": submitted, "computed": computed, "cached": cached, "unique": unique,
        "forwards": stats["prefills"], "seconds": seconds, "cpu_s": cpu,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "turns_mean": sum(s.reward_info.get("turns", 0) for s in samples) / max(len(samples), 1),
        "samples": [{"tokens": s.prompt_ids + s.response_ids, "logprobs": s.response_logprobs,
                     "mask": s.loss_mask} for s in samples],
    }


def side(args: argparse.Namespace, recipe: str, cache_gb: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--side", "--recipe", recipe, "--cache-gb", str(cache_gb),
           "--prompts", str(args.prompts), "--samples", str(args.samples),
           "--max-new-tokens", str(args.max_new_tokens), "--threads", str(args.threads)]
    model = dict(m.split("=", 1) for m in args.model or []).get(recipe)
    if model:
        cmd += ["--model", f"{recipe}={model}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{recipe} with prefix_cache_gb={cache_gb} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(off: dict[str, Any], on: dict[str, Any]) -> tuple[float, int]:
    """Largest |log-prob difference| over sampled tokens of trajectories whose tokens agree,
    and how many trajectories' tokens differ."""
    worst, differ = 0.0, 0
    for a, b in zip(off["samples"], on["samples"]):
        if a["tokens"] != b["tokens"]:
            differ += 1
            continue
        worst = max([worst] + [abs(x - y) for x, y, m in zip(a["logprobs"], b["logprobs"], a["mask"]) if m])
    return worst, differ + abs(len(off["samples"]) - len(on["samples"]))


def row(off: dict[str, Any], on: dict[str, Any]) -> dict[str, Any]:
    diff, differ = compare(off, on)
    pick = ("submitted", "computed", "unique", "forwards", "seconds", "cpu_s", "peak_mb", "turns_mean")
    return {
        "off": {k: off[k] for k in pick}, "on": {k: on[k] for k in pick},
        "prefill_ratio_off": off["computed"] / off["submitted"], "prefill_ratio_on": on["computed"] / on["submitted"],
        "computed_per_unique_on": on["computed"] / on["unique"],
        "rollout_time_ratio": on["seconds"] / off["seconds"], "cpu_ratio": on["cpu_s"] / off["cpu_s"],
        "max_logprob_diff": diff, "trajectories_differing": differ,
    }


def print_table(rows: dict[str, dict[str, Any]]) -> None:
    for recipe, r in rows.items():
        print(f"\n{recipe}: {r['off']['turns_mean']:.2f} model turns per trajectory, "
              f"{r['off']['forwards']} prefill forwards")
        print(f"{'':28}{'cache off':>12}{'cache on':>12}{'on/off':>9}")
        for label, key, fmt in (("prompt tokens submitted", "submitted", "{:.0f}"),
                                ("prefill tokens computed", "computed", "{:.0f}"),
                                ("trajectories' unique tokens", "unique", "{:.0f}"),
                                ("rollout phase s", "seconds", "{:.1f}"), ("CPU s", "cpu_s", "{:.1f}"),
                                ("peak memory MB", "peak_mb", "{:.0f}")):
            a, b = r["off"][key], r["on"][key]
            print(f"{label:28}{fmt.format(a):>12}{fmt.format(b):>12}{b / a if a else float('nan'):>8.2f}x")
        print(f"computed / submitted: off {r['prefill_ratio_off']:.3f}, on {r['prefill_ratio_on']:.3f}; "
              f"computed / unique (on) {r['computed_per_unique_on']:.2f}")
        print(f"max |log-prob difference| {r['max_logprob_diff']:.2e} "
              f"({r['trajectories_differing']} trajectories with different tokens)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", action="append", help="repeatable; default tiny/code_repair")
    parser.add_argument("--model", action="append", help="RECIPE=DIR: a model folder (a warm start) replacing "
                        "the recipe's; repeatable")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache-gb", type=float, default=1.0, help="the cache-on side's budget")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    recipes = args.recipe or ["tiny/code_repair"]
    if args.side:
        args.recipe = recipes[0]
        args.model = [m.split("=", 1)[1] for m in args.model or []]
        print(json.dumps(one_side(args)))
        return
    rows = {recipe: row(side(args, recipe, 0.0), side(args, recipe, args.cache_gb)) for recipe in recipes}
    if args.json:
        worst = {key: max(r[key] for r in rows.values())
                 for key in ("prefill_ratio_on", "prefill_ratio_off", "rollout_time_ratio", "max_logprob_diff")}
        print(json.dumps({**worst, "recipes": rows}, indent=2))
    else:
        print_table(rows)


if __name__ == "__main__":
    main()
