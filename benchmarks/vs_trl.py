"""The main job against TRL's ``GRPOTrainer``, one after the other on the same machine.

Both sides get the same model folder (where the recipe has a supervised warm start, the model
that warm start saves, run once here: from the tiny model as built every sample scores 0, so
neither side learns and the reward curves would compare nothing), the same prompts in the same
order (exported from the recipe's data source by our mixer with the run's seed; TRL reads them
unshuffled), the same reward (our data source's reward: TRL's reward function posts its
completions to a loopback server this script runs, which scores them with it), the same batch
(prompts x samples), the same maximum new tokens, temperature, learning rate, clipping (ε_low /
ε_high), gradient clipping, number of optimizer steps (one per batch) and threads, and no KL
term. TRL runs in its own venv (``$LOONGSAGE_CACHE/venvs/trl``, created on first use with torch
pinned to ours, so nothing in our venv moves).

Each side runs as one command whose whole process tree is sampled (summed RSS and PSS every
``--interval`` s, ``benchmarks/memory.py``). Reported per side: seconds per step (median
excluding the first), wall time including start-up, completion tokens per step, peak summed
RSS and PSS, the reward curve; and the ratios ours / TRL (``step_time_ratio``,
``peak_memory_ratio`` on PSS) at the top level of ``--json``.

    .venv/bin/python benchmarks/vs_trl.py [--model tiny|smollm2] [--steps 5] [--no-warm-start] [--json]
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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory import GB, measure  # noqa: E402  (benchmarks/memory.py, beside this file)
from runs import warm_start  # noqa: E402  (benchmarks/runs.py)

from loongsage.config.compose import load_config  # noqa: E402
from loongsage.data.mixer import DataMixer  # noqa: E402
from loongsage.data.sources import build_sources  # noqa: E402
from loongsage.models.resolve import resolve_model_path  # noqa: E402

RECIPES = {"tiny": "tiny/grpo", "smollm2": "smollm2/grpo"}
TRL_VERSION = "1.16.0"


def trl_python() -> Path:
    """The TRL venv's python, made on first use: torch and transformers pinned to ours."""
    root = Path(os.environ.get("LOONGSAGE_CACHE", Path.home() / ".cache" / "loongsage")) / "venvs" / "trl"
    python = root / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
        pins = [f"torch=={metadata.version('torch').split('+')[0]}", f"transformers=={metadata.version('transformers')}",
                f"accelerate=={metadata.version('accelerate')}", f"trl=={TRL_VERSION}", "datasets"]
        subprocess.run([str(python), "-m", "pip", "install", "-q", *pins], check=True)
    return python


def export_prompts(recipe: str, overrides: list[str], count: int) -> tuple[list[dict], dict]:
    """The first ``count`` prompts our run draws (messages, ground truth) and the sources."""
    spec = load_config(recipe, overrides)
    cfg = spec.cfg
    sources = build_sources(spec.sources, spec.registries, cfg.trainer.seed)
    mixer = DataMixer.from_sources(sources, cfg.trainer.seed, batch_size=cfg.rollout.prompts_per_step)
    prompts = mixer.next_prompts(count)
    return [{"messages": p.messages, "ground_truth": p.ground_truth, "source": p.source} for p in prompts], sources


class RewardServer:
    """Scores TRL's completions with our data source's reward, over loopback HTTP."""

    def __init__(self, source) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                rewards = [float(source.score(text, truth)["score"])
                           for text, truth in zip(body["texts"], body["ground_truths"])]
                data = json.dumps({"rewards": rewards}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/score"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def side_summary(name: str, peaks, steps: list[dict]) -> dict:
    seconds = [s["seconds"] for s in steps]
    return {
        "side": name, "returncode": peaks.returncode, "steps": len(steps),
        "step_s_median": statistics.median(seconds[1:] or seconds) if seconds else None,
        "step_s": [round(s, 2) for s in seconds], "wall_s": round(peaks.wall_s, 1),
        "tokens_per_step": statistics.mean(s["tokens"] for s in steps) if steps else None,
        "peak_pss_gb": round(peaks.pss / GB, 2), "peak_rss_gb": round(peaks.rss / GB, 2),
        "cpu_s": round(peaks.cpu_s, 1), "reward_curve": [round(s["reward_mean"], 3) for s in steps],
    }


def run_ours(recipe: str, overrides: list[str], workdir: Path, interval: float) -> dict:
    run_dir = workdir / "ours"
    loongsage = Path(sys.executable).parent / "loongsage"
    command = " ".join([str(loongsage), "train", "--config-name", recipe, *overrides, f"trainer.run_dir={run_dir}"])
    peaks = measure(command, interval, echo=False)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines() if (run_dir / "metrics.jsonl").exists() else []
    steps = []
    for line in lines:
        record = json.loads(line)
        if "timing/step" in record:
            steps.append({"seconds": record["timing/step"], "reward_mean": record["rollout/reward_mean"],
                          "tokens": record["rollout/response_length_mean"] * record["rollout/num_samples"]})
    return side_summary("loongsage", peaks, steps)


def run_trl(job: dict, workdir: Path, interval: float) -> dict:
    job_path, out = workdir / "trl_job.json", workdir / "trl_steps.jsonl"
    job_path.write_text(json.dumps({**job, "out": str(out), "workdir": str(workdir / "trl")}))
    command = f"{trl_python()} {Path(__file__).resolve().parent / 'trl_side.py'} {job_path}"
    peaks = measure(command, interval, echo=False)
    steps = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    samples = job["prompts_per_step"] * job["samples"]
    for step in steps:
        step["tokens"] = (step.get("response_length_mean") or 0.0) * samples
    return side_summary("trl", peaks, steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(RECIPES), default="tiny")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--interval", type=float, default=0.5, help="memory sampling period, seconds")
    parser.add_argument("--no-warm-start", dest="warm_start", action="store_false",
                        help="start both sides from the recipe's model as shipped, not its warm start")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    recipe = RECIPES[args.model]
    # both sides start from the same model folder (the recipe's warm start, run once, where it
    # has one) and train without KL
    common = [f"trainer.steps={args.steps}", "trainer.eval_interval=0", "checkpoint.interval=0", "trainer.sft.steps=0",
              "algorithm.kl.coef=0.0", f"train.num_threads={args.threads}"]
    spec = load_config(recipe, common)
    cfg = spec.cfg
    warm = args.warm_start and load_config(recipe, []).cfg.trainer.sft.steps > 0
    count = args.steps * cfg.rollout.prompts_per_step
    prompts, sources = export_prompts(recipe, common, count)
    params = spec.algorithm.policy_loss.params
    server = RewardServer(sources[prompts[0]["source"]])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            model = warm_start(recipe, workdir / "warm_start") if warm else resolve_model_path(str(cfg.model.path))
            job = {"model": str(model), "prompts": prompts,
                   "prompts_per_step": cfg.rollout.prompts_per_step, "samples": cfg.rollout.n_samples_per_prompt,
                   "max_tokens": cfg.rollout.max_new_tokens, "temperature": cfg.rollout.temperature,
                   "lr": cfg.train.lr, "grad_clip": cfg.train.grad_clip, "eps_low": params.eps_low,
                   "eps_high": params.eps_high, "steps": args.steps, "threads": args.threads,
                   "seed": cfg.trainer.seed, "reward_url": server.url}
            trl = run_trl(job, workdir, args.interval)
            ours = run_ours(recipe, [*common, f"model.path={model}"], workdir, args.interval)
    finally:
        server.close()
    ratio = (lambda a, b: round(a / b, 3) if a and b else None)
    result = {
        "model": args.model, "warm_start": warm, "steps": args.steps, "threads": args.threads,
        "batch": f"{cfg.rollout.prompts_per_step} x {cfg.rollout.n_samples_per_prompt}",
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "step_time_ratio": ratio(ours["step_s_median"], trl["step_s_median"]),
        "peak_memory_ratio": ratio(ours["peak_pss_gb"], trl["peak_pss_gb"]),
        "peak_rss_ratio": ratio(ours["peak_rss_gb"], trl["peak_rss_gb"]),
        "wall_time_ratio": ratio(ours["wall_s"], trl["wall_s"]),
        "loongsage": ours, "trl": trl,
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.model}{' (warm-started)' if warm else ''}: batch {result['batch']}, "
          f"{result['max_new_tokens']} new tokens, {args.steps} steps, {args.threads} threads")
    print(f"{'':12}{'s/step':>9}{'wall s':>9}{'tok/step':>10}{'PSS GB':>9}{'RSS GB':>9}  reward curve")
    for side in (trl, ours):
        print(f"{side['side']:12}{side['step_s_median'] or float('nan'):9.2f}{side['wall_s']:9.1f}"
              f"{side['tokens_per_step'] or float('nan'):10.0f}{side['peak_pss_gb']:9.2f}{side['peak_rss_gb']:9.2f}"
              f"  {side['reward_curve']}")
    print(f"ours / TRL: step time {result['step_time_ratio']}x, peak PSS {result['peak_memory_ratio']}x, "
          f"peak RSS {result['peak_rss_ratio']}x, wall {result['wall_time_ratio']}x")


if __name__ == "__main__":
    main()
