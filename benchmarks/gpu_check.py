"""GPU check, prepared for a lent GPU machine: one command, one JSON object per stage. Not CI.

    bash benchmarks/gpu_run.sh            # there, after benchmarks/gpu_wheels.sh here
    python3 benchmarks/gpu_check.py [--stage first|ray|all] [--out DIR] [--cpu]

It runs with a plain ``python3`` (the GPU machine's own, torch 2.11), the project's sources on
``PYTHONPATH`` and the wheels that machine lacks installed beside them (``gpu_run.sh`` does
both). Parts, in two stages so that the one needing Ray (79 MB of wheel, cut down to fit one
call by ``benchmarks/gpu_carry.py``) comes last; each part reports its own "ok" and, on
failure, the error; one failing part does not stop the others. Stage ``first`` (no Ray):

torch_api    Every ``torch`` name the sources use resolves in the installed torch
             (``benchmarks/torch_api.py``): on the GPU machine, nothing newer than its 2.11.
engines      The embedded train engine and rollout engine built on ``cuda:0`` (tiny model):
             device memory allocated before and after ``offload()`` and after ``onload()``
             (parameters, gradients, AdamW state; rollout weights), a train step and a
             generation after onload, and the rollout-vs-train logprob mismatch of the
             generated tokens on the GPU (fp32). After every move, every parameter,
             gradient, buffer and optimizer state tensor is asserted on the device the move
             named (``benchmarks/gpu_devices.py``); with ``--cpu``, where moves are no-ops, both
             engines' ``onload()`` is dry-run towards the ``meta`` device and asserted the same way.
megatron     The megatron train engine (``train.backend=megatron``, TP=1, one rank, NCCL beside
             gloo) on ``cuda:0``: fp32 log-probs against the embedded engine's (max abs diff;
             1e-5 on CPU), then bf16 (``model.dtype=bfloat16``): log-probs against the
             embedded bf16 engine, a train step's loss and grad norm, median step seconds.
             Needs megatron-core (carried); on ``--cpu`` fp32 over gloo only.
transfer     ``benchmarks/transfer_mesh.py``'s CUDA rows: TransferMesh CUDA IPC (receiver on the
             sender's GPU) and NCCL (receiver on a second GPU; skipped with one) against a
             device memcpy of the same bytes, SmolLM2-135M-shaped fp32 state dict.

Stage ``ray`` (Ray, Hydra, the router's FastAPI, installed only for this stage):

tiny_run     ``loongsage train --config-name tiny/grpo`` on the GPUs, colocated with
             offload/onload between phases: ``placement.gpus_per_node`` = the GPUs visible,
             ``train.dp_size`` = ``rollout.num_engines`` = min(2, GPUs) (FSDP2 over NCCL with
             two), 4 steps; its layout (every actor on ``cuda``, its GPU ids) and metrics.
             With one GPU there is one rank and no NCCL between ranks (said in the JSON).
sglang_run   The tiny recipe on ``rollout.backend=sglang``: a real SGLang server (skipped when
             ``sglang`` is not installed), colocated (weights as CUDA IPC handles through
             ``/update_weights_from_tensor``) and, with two GPUs, disaggregated (NCCL through
             ``/update_weights_from_distributed``, on the asynchronous runtime that placement
             requires): requests per sync, the rollout-vs-train
             logprob gap at the last step. Never run on a GPU; SGLang is not carried (its
             wheels are GPU builds far over the limit), so on the lent machine it says skipped.

Without CUDA it prints ``{"skipped": ...}`` and exits 0. ``--cpu`` runs every part on the CPU
instead, to check the script itself (the offload figures are then zero, the mesh rows shm);
``.ci/gpu_check_cpu`` does so in CI, in a venv holding only what the GPU machine holds plus
the carried wheels. ``--out DIR`` rewrites ``DIR/<stage>.json`` after every part, so a
time-out loses only the parts not yet run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpu_devices import assert_on, dry_run_onload, module_tensors, train_state_tensors  # noqa: E402
from runs import run_env  # noqa: E402  (benchmarks/runs.py)


def part(name: str, fn: Callable[[], dict], out: dict) -> None:
    start = time.perf_counter()
    try:
        out[name] = {"ok": True, **fn()}
    except Exception as exc:  # report and go on with the next part
        out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                     "traceback": traceback.format_exc()[-3000:]}
    out[name]["seconds"] = time.perf_counter() - start


def _allocated(device: str) -> int:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated(torch.device(device))
    return 0


def check_engines(device: str) -> dict:
    from loongsage.controller.sft import Demonstration, sft_batch, token_mean_nll
    from loongsage.engines.batch import TrainBatch
    from loongsage.engines.client import EngineClient
    from loongsage.engines.embedded_rollout.engine import EmbeddedRolloutEngine
    from loongsage.engines.embedded_train import EmbeddedTrainEngine
    from loongsage.models.tiny import ensure_tiny_model
    from loongsage.schema import ModelConfig, TrainConfig

    path = str(ensure_tiny_model())
    out: dict[str, Any] = {}
    trainer = EmbeddedTrainEngine(ModelConfig(path=path), TrainConfig(lr=1e-4), device=device)
    demo = Demonstration([{"role": "user", "content": "What is 2 + 3?"}],
                         [{"role": "assistant", "content": "\\boxed{5}"}])
    batch = sft_batch(trainer.tokenizer, [demo] * 4)
    trainer.train_step(batch, token_mean_nll)  # AdamW state exists from here on
    memory = {"train_before": _allocated(device)}
    out["train_offload_moved"] = trainer.offload()
    memory["train_offloaded"] = _allocated(device)
    checked = {"train_offloaded": assert_on(train_state_tensors(trainer), "cpu", "train offload")}
    out["train_onload_moved"] = trainer.onload()
    memory["train_onloaded"] = _allocated(device)
    checked["train_onloaded"] = assert_on(train_state_tensors(trainer), device, "train onload")
    out["train_step_after_onload"] = trainer.train_step(batch, token_mean_nll)["train/loss"]

    engine = EmbeddedRolloutEngine(path, device=device)
    client = EngineClient(engine.start())
    try:
        text = trainer.tokenizer.apply_chat_template(demo.messages, add_generation_prompt=True,
                                                     tokenize=False)
        prompt = trainer.tokenizer.encode(text, add_special_tokens=False)
        sampling = {"temperature": 1.0, "max_new_tokens": 16}
        client.generate(prompt, sampling)
        memory["rollout_before"] = _allocated(device)
        out["rollout_offload_moved"] = engine.offload()
        memory["rollout_offloaded"] = _allocated(device)
        checked["rollout_offloaded"] = assert_on(module_tensors(engine.model), "cpu", "rollout offload")
        out["rollout_onload_moved"] = engine.onload()
        engine.apply_weights(list(trainer.named_tensors(include_tied=False)))
        memory["rollout_onloaded"] = _allocated(device)
        checked["rollout_onloaded"] = assert_on(module_tensors(engine.model), device, "rollout onload")
        generated = client.generate(prompt, sampling)
        ids = list(prompt) + list(generated.output_ids)
        scored = torch.zeros(1, len(ids))  # the engine scores only loss-mask positions
        scored[0, len(prompt):] = 1.0
        row = TrainBatch(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long), scored)
        train_lp = trainer.compute_logprobs(row)["logprobs"][0, len(prompt):]
        rollout_lp = torch.tensor(generated.output_logprobs)
        log_ratio = train_lp - rollout_lp
        out["generated_tokens"] = len(generated.output_ids)
        out["k3_mismatch"] = float((torch.exp(log_ratio) - 1 - log_ratio).mean())
        out["logprob_abs_diff_max"] = float(log_ratio.abs().max())
        if device == "cpu":  # the moves above were no-ops: rehearse them towards meta
            checked.update(dry_run_onload(trainer, engine))
    finally:
        client.close()
        engine.stop()
    out["memory_bytes"] = memory
    out["tensors_checked"] = checked
    out["offload_frees_device"] = (memory["train_offloaded"] < memory["train_before"]
                                   and memory["rollout_offloaded"] < memory["rollout_before"])
    return out


def _train(args: list[str], run_dir: Path, timeout: float = 480) -> list[dict]:
    """Run ``loongsage train`` with ``args``; return its metrics rows (raise with its output)."""
    done = subprocess.run(args, env=run_env(), capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"exit {done.returncode}: {done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _sglang_run(device: str, module: str, mode: str) -> dict:
    gpus = 1 if device.startswith("cuda") else 0
    with tempfile.TemporaryDirectory(prefix="gpu-check-sglang-") as folder:
        run_dir = Path(folder) / "run"
        args = [sys.executable, "-m", "loongsage.cli", "train", "--config-name", "tiny/grpo",
                f"trainer.run_dir={run_dir}", "logging.progress_bar=false", "trainer.steps=4",
                "trainer.sft.steps=4", "checkpoint.interval=0", f"placement.gpus_per_node={gpus}",
                f"placement.mode={mode}", "rollout.backend=sglang",
                *(["async.enable=true", "async.stale_steps=0"] if mode == "disaggregated" else []),
                f"rollout.sglang.launch_command=[{sys.executable},-m,{module}]",
                "rollout.sglang.mem_fraction_static=0.3"]
        rows = _train(args, run_dir, timeout=600)
        samples = [json.loads(line) for line in (run_dir / "samples" / "step_000003.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "timing/step" in r]
    gaps = [abs(a - b) for row in samples for a, b in zip(row["rollout_logprobs"], row["train_logprobs"])]
    return {"steps": len(steps),
            "last_step_weight_versions": sorted({v for row in samples for v in row["weight_versions"]}),
            "tensor_requests_per_sync": [r.get("perf/weight_sync_tensor_requests", 0.0) for r in steps],
            "rollout_vs_train_logprob_gap_max": max(gaps),
            "k3_mismatch_max": max(r["train/is_approx_k3_kl"] for r in steps),
            "weight_sync_s_median": statistics.median(r["perf/weight_sync_s"] for r in steps),
            "step_s_median": statistics.median(r["timing/step"] for r in steps)}


def check_sglang_run(device: str) -> dict:
    """The tiny recipe on ``rollout.backend=sglang``: a real ``python -m sglang.launch_server`` on
    the GPU, colocated (memory released and resumed around training, weights as CUDA IPC
    handles through ``/update_weights_from_tensor``) and, with two GPUs, disaggregated (weights
    over NCCL through ``/update_weights_from_distributed``); on ``--cpu`` the embedded SGLang
    stand-in (shared-memory handles, gloo)."""
    import importlib.util

    module = "sglang.launch_server" if device.startswith("cuda") else "loongsage.engines.embedded_rollout.sglang_compat"
    if device.startswith("cuda") and importlib.util.find_spec("sglang") is None:
        return {"skipped": "sglang is not installed: pip install 'loongsage-core[sglang]'"}
    out: dict[str, Any] = {"launcher": module, "colocated": _sglang_run(device, module, "colocated")}
    if not device.startswith("cuda"):  # keeps the CPU rehearsal inside CI's budget
        out["disaggregated"] = {"skipped": "on --cpu: tests/engines/test_sglang_launcher.py runs it"}
    elif torch.cuda.device_count() < 2:
        out["disaggregated"] = {"skipped": "needs two GPUs (one for the trainer, one for the server)"}
    else:
        out["disaggregated"] = _sglang_run(device, module, "disaggregated")
    return out


def check_tiny_run(device: str) -> dict:
    gpus = torch.cuda.device_count() if device.startswith("cuda") else 0
    ranks = max(1, min(2, gpus)) if gpus else 1
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
        run_dir = Path(folder) / "run"
        args = [sys.executable, "-m", "loongsage.cli", "train", "--config-name", "tiny/grpo",
                f"trainer.run_dir={run_dir}", "logging.progress_bar=false", "trainer.steps=4",
                "trainer.sft.steps=4", "checkpoint.interval=0", f"placement.gpus_per_node={gpus}",
                f"train.dp_size={ranks}", f"rollout.num_engines={ranks}",
                f"train.strategy={'fsdp2' if ranks > 1 else 'ddp'}"]
        if ranks > 1 and not gpus:
            args += ["placement.train_cpus=0.5", "placement.rollout_cpus=0.5"]
        rows = _train(args, run_dir)
        layout = json.loads((run_dir / "layout.json").read_text())
    steps = [r for r in rows if "timing/step" in r]
    actors = [{k: a[k] for k in ("role", "rank", "bundle", "device", "gpu_ids", "node_ip")}
              for a in layout["actors"]]
    return {
        "gpus_per_node": gpus, "dp_size": ranks, "strategy": "fsdp2" if ranks > 1 else "ddp",
        "nccl_between_ranks": ("skipped: needs two GPUs (one rank on one)" if gpus == 1
                               else "nccl" if gpus else "gloo (CPU)"),
        "actors": actors,
        "all_on_gpu": all(a["device"].startswith("cuda") for a in actors) if gpus else None,
        "steps": len(steps),
        "k3_mismatch_max": max(r["train/is_approx_k3_kl"] for r in steps),
        "reward_mean": [r["rollout/reward_mean"] for r in steps],
        "step_s_median": statistics.median(r["timing/step"] for r in steps),
        "train_s_median": statistics.median(r["timing/train"] for r in steps),
        "weight_sync_s_median": statistics.median(r["perf/weight_sync_s"] for r in steps),
        "weight_sync_gb": steps[-1]["perf/weight_sync_gb"],
    }


def check_megatron(device: str) -> dict:
    from loongsage.engines.batch import TrainBatch
    from loongsage.engines.embedded_train import EmbeddedTrainEngine
    from loongsage.engines.megatron.engine import MegatronTrainEngine
    from loongsage.models.tiny import ensure_tiny_model
    from loongsage.schema import ModelConfig, TrainConfig

    path = str(ensure_tiny_model())
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 500, (8, 64), generator=g)
    attn = torch.ones_like(ids)
    batch = TrainBatch(ids, attn, attn.float())
    out: dict[str, Any] = {}
    dtypes = ["float32"] if device == "cpu" else ["float32", "bfloat16"]
    megatron = None
    for dtype in dtypes:
        model = ModelConfig(path=path, dtype=dtype)
        embedded = EmbeddedTrainEngine(model, TrainConfig(lr=1e-5), device=device)
        if megatron is None:  # one process group per process: the bf16 engine reuses it
            megatron = MegatronTrainEngine(model, TrainConfig(lr=1e-5), device=device)
        else:
            megatron.model_cfg = model
            megatron.model = megatron._build(path)
            megatron.reset_optimizer()
        ours = megatron.compute_logprobs(batch)["logprobs"]
        theirs = embedded.compute_logprobs(batch)["logprobs"]
        out[f"{dtype}_logprob_max_abs_diff"] = float((ours - theirs).abs().max())
        steps = []
        for _ in range(3 if device.startswith("cuda") else 1):  # --cpu checks the script, not speed
            start = time.perf_counter()
            metrics = megatron.train_step(batch, lambda ctx: -(ctx.logprobs * ctx.batch.loss_mask).sum()
                                          / ctx.global_num_tokens)
            steps.append(time.perf_counter() - start)
        out[f"{dtype}_loss"], out[f"{dtype}_grad_norm"] = metrics["train/loss"], metrics["train/grad_norm"]
        out[f"{dtype}_step_s_median"] = statistics.median(steps)
    return out


def check_transfer(device: str) -> dict:
    from transfer_mesh import run_model

    only = {"cuda_ipc", "nccl"} if device.startswith("cuda") else {"shm"}
    result = run_model("smollm2-135m", 3 if device.startswith("cuda") else 1, 64 << 20, device, only)
    return {"bytes": result["bytes"], "skipped": result["skipped"],
            "rows": [{k: r[k] for k in ("method", "seconds", "gb_per_s", "x_memcpy") if k in r}
                     for r in result["rows"]]}


def check_torch_api(device: str) -> dict:
    from torch_api import check

    result = check()
    if result["missing"]:
        raise RuntimeError(f"torch {result['torch']} lacks {sorted(result['missing'])}: {result['missing']}")
    return result


# (stage, part) in the order they run; a stage is one process (benchmarks/gpu_run.sh)
PARTS: dict[str, tuple[str, Callable[[str], dict]]] = {
    "torch_api": ("first", check_torch_api),
    "engines": ("first", check_engines),
    "megatron": ("first", check_megatron),
    "transfer": ("first", check_transfer),
    "tiny_run": ("ray", check_tiny_run),
    "sglang_run": ("ray", check_sglang_run),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run every part on the CPU")
    parser.add_argument("--stage", choices=["first", "ray", "all"], default="all",
                        help="first: the parts without Ray; ray: the parts that start Ray")
    parser.add_argument("--out", type=Path, help="rewrite OUT/<stage>.json after every part")
    args = parser.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device (torch.cuda.is_available() is False)",
                          "torch": torch.__version__}))
        return 0
    device = "cpu" if args.cpu else "cuda:0"
    gpus = [] if args.cpu else [torch.cuda.get_device_name(i)
                                for i in range(torch.cuda.device_count())]
    out: dict[str, Any] = {"stage": args.stage, "device": device, "torch": torch.__version__,
                           "python": sys.version.split()[0], "gpus": gpus}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    for name, (stage, check) in PARTS.items():
        if args.stage not in ("all", stage):
            continue
        part(name, partial(check, device), out)
        shown = {k: v for k, v in out[name].items() if k != "traceback"}  # in the file
        print(json.dumps({"part": name, **shown}), flush=True)
        out["ok"] = all(out[n]["ok"] for n in PARTS if n in out)
        if args.out:
            (args.out / f"{args.stage}.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k not in PARTS}
                     | {"parts_ok": {n: out[n]["ok"] for n in PARTS if n in out}}))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
