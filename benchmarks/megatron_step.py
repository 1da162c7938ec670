"""Train-step throughput of the megatron engine vs the embedded engine, same batch, one process.

Both engines load the same HF checkpoint (tp=1, fp32, one gloo rank for Megatron) and run
``train_step`` on the same right-padded batch (``--rows`` sequences of 24-``--length``
tokens, the last two thirds trained) with the same loss closure (token-mean NLL), micro-batch
size and torch thread count, interleaved round by round. Reported per engine: the median
over ``--rounds`` of trained tokens per wall-clock second and per CPU-second of this process
(all its threads; on a shared machine CPU time swings less than wall-clock), and the
megatron / embedded ratios. Before timing, one step of each is checked to produce the same
loss (within 1e-5) so both sides do the same work.

    .venv/bin/python benchmarks/megatron_step.py [--model tiny|smollm2] [--rows 16]
        [--length 128] [--rounds 5] [--threads 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read once, when torch loads OpenMP

import torch  # noqa: E402


def make_batch(rows: int, length: int, vocab: int, seed: int = 0):
    from loongsage.engines.batch import TrainBatch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (rows, length), generator=g)
    attn = torch.zeros(rows, length, dtype=torch.long)
    lengths = torch.linspace(24, length, rows).long()
    for row, n in enumerate(lengths.tolist()):
        attn[row, :n] = 1
    loss_mask = attn.float()
    loss_mask[:, : length // 3] = 0
    return TrainBatch(ids.masked_fill(attn == 0, 0), attn, loss_mask)


def nll(ctx):
    return -(ctx.logprobs * ctx.batch.loss_mask).sum() / ctx.global_num_tokens


def timed_step(engine, batch) -> tuple[float, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    loss = engine.train_step(batch, nll)["train/loss"]
    return time.perf_counter() - wall, time.process_time() - cpu, loss


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", choices=["tiny", "smollm2"])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args(argv)

    from loongsage.engines.embedded_train import EmbeddedTrainEngine
    from loongsage.engines.megatron.engine import MegatronTrainEngine
    from loongsage.models.resolve import resolve_model_path
    from loongsage.schema import ModelConfig, TrainConfig

    torch.set_num_threads(args.threads)
    path = str(resolve_model_path(f"builtin:{args.model}"))
    train = TrainConfig(lr=1e-6, micro_batch_size=args.micro_batch, num_threads=args.threads)
    engines = {"embedded": EmbeddedTrainEngine(ModelConfig(path=path), train, device="cpu"),
               "megatron": MegatronTrainEngine(ModelConfig(path=path), train, device="cpu")}
    batch = make_batch(args.rows, args.length, engines["megatron"].hf_config.vocab_size)
    tokens = float(batch.loss_mask.sum())
    warm = {name: timed_step(engine, batch)[2] for name, engine in engines.items()}
    if abs(warm["embedded"] - warm["megatron"]) > 1e-5 * max(1.0, abs(warm["embedded"])):
        print(f"losses differ: {warm}", file=sys.stderr)
        return 1
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            wall, cpu, _ = timed_step(engine, batch)
            samples[name].append((tokens / wall, tokens / cpu))
    rows = {name: {"tokens_per_s": statistics.median(w for w, _ in values),
                   "tokens_per_cpu_s": statistics.median(c for _, c in values)}
            for name, values in samples.items()}
    result = {"model": args.model, "rows": args.rows, "length": args.length,
              "micro_batch": args.micro_batch, "threads": args.threads, "rounds": args.rounds,
              "trained_tokens": tokens, "engines": rows,
              "ratio_tokens_per_s": rows["megatron"]["tokens_per_s"] / rows["embedded"]["tokens_per_s"],
              "ratio_tokens_per_cpu_s": rows["megatron"]["tokens_per_cpu_s"] / rows["embedded"]["tokens_per_cpu_s"]}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"train step, {args.model}, {args.rows} rows x <= {args.length} tokens "
          f"({tokens:.0f} trained), micro-batch {args.micro_batch}, {args.threads} thread(s), "
          f"median of {args.rounds}")
    print(f"{'engine':<10} {'tokens/s':>10} {'tokens/CPU-s':>13}")
    for name, row in rows.items():
        print(f"{name:<10} {row['tokens_per_s']:>10.1f} {row['tokens_per_cpu_s']:>13.1f}")
    print(f"megatron / embedded: {result['ratio_tokens_per_s']:.2f}x tokens/s, "
          f"{result['ratio_tokens_per_cpu_s']:.2f}x tokens/CPU-s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
