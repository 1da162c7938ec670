"""What LoRA saves against full fine-tuning: trainer memory and weight-sync bytes (SmolLM2).

Each mode runs in a fresh subprocess of this script (so one mode's allocations never show in
the other's RSS), on the same batch, with the embedded train engine as runs use it:

* ``full``: every weight trains (AdamW moments for all of them); a KL run's reference is a
  second copy of the model, loaded from disk on first use;
* ``lora``: ``train.lora`` adapters (rank, alpha, target modules below) train, the rest is
  frozen; the reference is the same model with its adapters off.

Per mode: RSS after building the engine, peak RSS over the train steps and one reference
forward (sampled every 5 ms), RSS after them (heap trimmed), trainable parameters, AdamW state
bytes, the bytes one weight sync sends (``named_tensors(include_tied=False)``, what
TransferMesh ships) and the mean step time (noisy on a shared machine: a ratio, not a claim).
The LoRA run then syncs its adapters into an embedded rollout engine in the same process
(``apply_weights``, merged on receipt) and reports the largest gap between the engine's
sampled-token log-probs and the trainer's, against a full forward of an independent merge by
peft, and against the same engine loaded with that merge's weights and sampling with the same
seed (the comparison that isolates the merge from decode-vs-full-forward rounding).

    .venv/bin/python benchmarks/lora.py [--model smollm2|tiny] [--rows 8] [--tokens 128]
                                        [--steps 3] [--rank 16] [--lr 1e-5] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

import torch

from loongsage.controller.memory import PeakSampler, rss_bytes
from loongsage.engines.memory import release_free_memory
from loongsage.engines.batch import TrainBatch
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.models.resolve import resolve_model_path
from loongsage.schema import LoraSettings, ModelConfig, TrainConfig

MB = 1 << 20
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def batch_of(rows: int, tokens: int, vocab: int) -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (rows, tokens), generator=g)
    mask = torch.zeros(rows, tokens)
    mask[:, tokens // 4:] = 1.0
    return TrainBatch(ids, torch.ones_like(ids), mask, {})


def nll(ctx):
    return -(ctx.logprobs * ctx.batch.loss_mask).sum() / ctx.global_num_tokens


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def engine_sample(path: str, weights: list, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    """24 tokens sampled (seed 1) by an embedded rollout engine loaded from ``path`` after one
    sync of ``weights``: the ids and the engine's log-probs."""
    from loongsage.engines.embedded_rollout import EmbeddedRolloutEngine
    from loongsage.engines.embedded_rollout.params import SamplingParams
    from loongsage.engines.embedded_rollout.scheduler import Request

    rollout = EmbeddedRolloutEngine(path, num_threads=0, seed=1)
    rollout.scheduler.start()  # apply_weights swaps on the decode thread
    rollout.apply_weights(weights)
    done = []
    req = Request("r", prompt, SamplingParams(max_new_tokens=24, ignore_eos=True), lambda n, fin: fin and done.append(1))
    rollout.scheduler.submit(req)
    while not done:
        time.sleep(0.05)
    rollout.stop()
    return req.output_ids, torch.tensor(req.logprobs)


def engine_logprob_gap(engine: EmbeddedTrainEngine, path: str) -> dict[str, float]:
    """Sync the adapters into a rollout engine, generate, compare its log-probs with the
    trainer's, with a full forward of peft's merged model, and with the same engine loaded
    with that merged model's weights (same decode numerics and sampling seed: only the merge
    differs). ``adapter_logprob_shift``: how far the adapter moved the trainer's log-probs
    from the base model's on those tokens (the scale the gaps are small against)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    vocab = engine.model.config.vocab_size
    prompt = [int(t) for t in torch.randint(3, vocab, (16,), generator=torch.Generator().manual_seed(1))]
    out_ids, engine_lp = engine_sample(path, list(engine.named_tensors(include_tied=False)), prompt)
    ids = torch.tensor([prompt + out_ids])
    batch = TrainBatch(ids, torch.ones_like(ids), torch.ones(ids.shape), {})
    trainer_lp = engine.compute_logprobs(batch)["logprobs"][0, len(prompt):]
    base_lp = engine.compute_ref_logprobs(batch)[0, len(prompt):]
    with tempfile.TemporaryDirectory() as folder:
        engine.save(folder)
        base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        merged = PeftModel.from_pretrained(base, folder).merge_and_unload().eval()
        with torch.no_grad():
            logp = merged(ids).logits.float().log_softmax(-1)[0]
    peft_lp = torch.stack([logp[i - 1, ids[0, i]] for i in range(len(prompt), ids.shape[1])])
    merged_ids, merged_engine_lp = engine_sample(path, list(merged.state_dict().items()), prompt)
    same = merged_ids == out_ids
    return {"logprob_gap_vs_trainer": float((engine_lp - trainer_lp).abs().max()),
            "logprob_gap_vs_peft_merge": float((engine_lp - peft_lp).abs().max()),
            "logprob_gap_vs_engine_with_merged_weights":
                float((engine_lp - merged_engine_lp).abs().max()) if same else float("nan"),
            "engine_with_merged_weights_same_tokens": float(same),
            "adapter_logprob_shift": float((trainer_lp - base_lp).abs().max())}


def run_one(args: argparse.Namespace) -> dict[str, float]:
    path = str(resolve_model_path(f"builtin:{args.model}"))
    lora = LoraSettings(rank=args.rank if args.one == "lora" else 0, alpha=2.0 * args.rank, target_modules=TARGETS)
    start = rss_bytes()
    engine = EmbeddedTrainEngine(ModelConfig(path=path), TrainConfig(lr=args.lr, micro_batch_size=args.micro_batch,
                                                                     lora=lora), device="cpu")
    release_free_memory()
    built = rss_bytes()
    batch = batch_of(args.rows, args.tokens, engine.model.config.vocab_size)
    sampler = PeakSampler(rss_bytes, 0.005)
    times = []
    for _ in range(args.steps):
        began = time.perf_counter()
        engine.train_step(batch, nll)
        times.append(time.perf_counter() - began)
    engine.compute_ref_logprobs(batch)  # a KL run's reference forward
    peak = sampler.take()
    release_free_memory()
    settled = rss_bytes()
    moments = [t for state in engine.optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
    out = {
        "rss_start_mb": start / MB, "rss_built_mb": built / MB, "rss_peak_mb": peak / MB,
        "rss_after_mb": settled / MB,
        "trainable_params": float(sum(p.numel() for p in engine.model.parameters() if p.requires_grad)),
        "optimizer_state_mb": tensor_bytes(moments) / MB,
        "sync_mb": tensor_bytes(t for _, t in engine.named_tensors(include_tied=False)) / MB,
        "step_s": sum(times[1:]) / max(len(times) - 1, 1),
    }
    if args.one == "lora":
        out.update(engine_logprob_gap(engine, path))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--json", action="store_true")
    p.add_argument("--one", choices=["full", "lora"], help=argparse.SUPPRESS)  # a child run
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_one(args)))
        return
    child = [a for a in sys.argv[1:] if a != "--json"]
    results = {}
    for mode in ("full", "lora"):
        done = subprocess.run([sys.executable, __file__, *child, "--one", mode], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{mode} run failed:\n{done.stderr[-3000:]}")
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{mode}: {json.dumps(results[mode])}", file=sys.stderr, flush=True)
    full, lora = results["full"], results["lora"]
    ratios = {key: full[key] / lora[key] for key in ("rss_peak_mb", "rss_after_mb", "optimizer_state_mb", "sync_mb",
                                                      "step_s") if lora[key]}
    report = {"model": args.model, "rows": args.rows, "tokens": args.tokens, "rank": args.rank, "lr": args.lr,
              "target_modules": TARGETS, "full": full, "lora": lora, "full_over_lora": ratios}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{args.model}: {args.rows} x {args.tokens} tokens, {args.steps} steps; LoRA rank {args.rank} on {TARGETS}")
    print(f"{'':22s}{'full':>12s}{'lora':>12s}{'full/lora':>11s}")
    for key in ("rss_built_mb", "rss_peak_mb", "rss_after_mb", "trainable_params", "optimizer_state_mb", "sync_mb",
                "step_s"):
        ratio = f"{full[key] / lora[key]:10.1f}x" if lora[key] else ""
        print(f"{key:22s}{full[key]:12.1f}{lora[key]:12.1f}{ratio:>11s}")
    print(f"LoRA engine log-prob gap: vs trainer {lora['logprob_gap_vs_trainer']:.2e}, "
          f"vs peft merge {lora['logprob_gap_vs_peft_merge']:.2e}, vs the engine with the merged weights "
          f"{lora['logprob_gap_vs_engine_with_merged_weights']:.2e} (the adapter moved log-probs by "
          f"{lora['adapter_logprob_shift']:.2e})")


if __name__ == "__main__":
    main()
