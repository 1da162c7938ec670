"""What multi-teacher distillation costs: memory of full-vocabulary KL, teacher swaps, step time.

Three measurements, each against its baseline in the same process, interleaved round by round:

* **Peak memory of one full-vocabulary KL train step** (``full_kl``, GKD loss, forward and
  backward over ``--rows`` x ``--tokens``): the teacher ships its final hidden states and the
  train actor rebuilds its logits one chunk at a time inside the student's chunked LM head
  (what runs do), against materialising the teacher's full-vocabulary log-probs for the whole
  batch first and reading them chunk by chunk (what shipping teacher logits costs). Peak RSS
  above the process's settled RSS, sampled every 5 ms, plus the bytes of what each ships.
* **Teacher swap time** in a slot of two teachers: a plain ``copy_`` of the same bytes (the
  physical limit), ``switch`` without prefetch (the copy, blocking), and with prefetch (the
  copy runs on a thread while the other teacher computes; ``switch`` only waits for what is
  left). For the two-bucket forward: wall time with and without prefetch and the overlap.
* **Step time with 1, 2 and 3 teachers sharing one slot**: the teacher forward (the batch
  split between the teachers, swaps and prefetch included) plus the student's GKD train step,
  the batch and its size fixed; ratios against one teacher.

Teachers are copies of the model (their weights' values do not change the costs); the student
is the model with small random noise added to its weights, so the KL is not 0 and the two
full-vocabulary paths can be checked to give the same loss (the student's learning rate is
0: its steps cost what real ones do but leave it unchanged between the measurements). In-process, no Ray, so only the
work measured runs.

    .venv/bin/python benchmarks/distill.py [--model smollm2|tiny] [--rows 32] [--tokens 128]
                                           [--micro-batch 8] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from dataclasses import dataclass

import torch

from loongsage.controller.memory import GB, PeakSampler, rss_bytes
from loongsage.engines.memory import release_free_memory
from loongsage.engines.batch import LogitTerm, TrainBatch
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.models.resolve import resolve_model_path
from loongsage.plugins import load_plugins
from loongsage.schema import ModelConfig, TrainConfig
from loongsage_distill.kl_methods import full_kl
from loongsage_distill.teacher_engine import EmbeddedTeacherEngine, Job, Wants
from loongsage_distill.train_term import HIDDEN, OPDTerm, SOURCE, TEACHER

MB = 1 << 20


def batch_of(rows: int, tokens: int, vocab: int, seed: int = 0) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (rows, tokens), generator=g)
    mask = torch.zeros(rows, tokens)
    mask[:, tokens // 4:] = 1.0  # a quarter prompt, the rest response
    return TrainBatch(ids, torch.ones_like(ids), mask, {})


def gkd_term(path: str, teachers: int) -> OPDTerm:
    method = load_plugins().resolve("kl_policy", "full_kl", "opd.gkd_kl_method")
    return OPDTerm(pg_ratio=0.0, gkd_ratio=1.0, pg_method=None, gkd_method=method, beta=0.5, topk=8,
                   head_paths=(path,) * teachers, fp32=True, source_names=("s",), loss_agg_mode="token_mean",
                   loss_agg_norm_len=None)


@dataclass(frozen=True)
class MaterialisedKL:
    """The baseline's ``LogitTerm``: KL against teacher log-probs held for the whole batch."""

    def __call__(self, logits: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
        kl = full_kl(logits, teacher_logprobs)
        return torch.stack([kl, torch.zeros_like(kl)], -1)


def teacher_hidden(teacher: EmbeddedTeacherEngine, batch: TrainBatch, teachers: int) -> dict:
    """Extras of one batch split evenly between ``teachers`` of one slot (swaps included)."""
    rows = torch.tensor_split(torch.arange(len(batch)), teachers)
    jobs = [Job(t, batch.input_ids[r], batch.attention_mask[r]) for t, r in enumerate(rows)]
    outputs, stats = teacher.forward(jobs, Wants(entropy=True, hidden=True))
    hidden = torch.cat([o["hidden"] for o in outputs])
    entropy = torch.cat([o["entropy"] for o in outputs])
    owner = torch.cat([torch.full((len(r),), t) for t, r in enumerate(rows)])
    return {HIDDEN: hidden, "teacher_entropy": entropy, TEACHER: owner,
            SOURCE: torch.zeros(len(batch), dtype=torch.long)}, stats


def peak_above(fn) -> tuple[float, object]:
    """(peak RSS above the settled RSS during ``fn()``, in bytes; its result)."""
    gc.collect()
    release_free_memory()
    sampler = PeakSampler(rss_bytes, interval_s=0.005)
    base = sampler.take()
    try:
        out = fn()
        return sampler.take() - base, out
    finally:
        sampler.close()


def memory_rounds(student: EmbeddedTrainEngine, teacher: EmbeddedTeacherEngine, path: str, args) -> dict:
    teacher.slot.switch(0)
    vocab = teacher.vocab
    batch = batch_of(args.rows, args.tokens, vocab)
    term = gkd_term(path, 1)
    head = teacher.model.get_output_embeddings().weight.float()

    def rebuilt():
        extras, _ = teacher_hidden(teacher, batch, 1)
        b = TrainBatch(batch.input_ids, batch.attention_mask, batch.loss_mask, extras)
        return student.train_step(b, lambda ctx: term.loss(ctx), logit_term=term.logit_term)

    def materialised():
        extras, _ = teacher_hidden(teacher, batch, 1)
        with torch.no_grad():
            extras["teacher_full_logprobs"] = torch.log_softmax(extras.pop(HIDDEN) @ head.T, -1)
        b = TrainBatch(batch.input_ids, batch.attention_mask, batch.loss_mask, extras)
        logit_term = LogitTerm(MaterialisedKL(), ("teacher_full_logprobs",), width=2)
        return student.train_step(b, lambda ctx: term.loss(ctx), logit_term=logit_term)

    peaks: dict[str, list[float]] = {"rebuilt": [], "materialised": []}
    losses: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, fn in (("rebuilt", rebuilt), ("materialised", materialised)):
            peak, metrics = peak_above(fn)
            peaks[name].append(peak)
            losses[name] = metrics["opd/loss"]
    shipped = {"rebuilt": args.rows * args.tokens * teacher.describe()["hidden"] * 4,
               "materialised": args.rows * args.tokens * vocab * 4}
    out = {name: {"peak_mb": statistics.median(v) / MB, "shipped_mb": shipped[name] / MB, "loss": losses[name]}
           for name, v in peaks.items()}
    out["ratio"] = out["materialised"]["peak_mb"] / out["rebuilt"]["peak_mb"]
    return out


def swap_rounds(teacher2: EmbeddedTeacherEngine, plain: EmbeddedTeacherEngine, args) -> dict:
    """Teachers 0 and 1 of a prefetching slot (``teacher2``) and of one without (``plain``)."""
    slot = teacher2.slot
    src = {dt: t.clone() for dt, t in slot.host[1].items()}
    dst = {dt: torch.empty_like(t) for dt, t in src.items()}
    batch = batch_of(args.rows, args.tokens, teacher2.vocab, seed=1)
    times: dict[str, list[float]] = {k: [] for k in ("copy", "switch", "switch_prefetched", "forward_plain",
                                                     "forward_prefetch", "overlap")}
    for _ in range(args.rounds):
        start = time.perf_counter()
        for dt in dst:
            dst[dt].copy_(src[dt])
        times["copy"].append(time.perf_counter() - start)
        for engine, key in ((plain, "forward_plain"), (teacher2, "forward_prefetch")):
            engine.slot.switch(0)
            engine.slot.take_stats()
            start = time.perf_counter()
            _, stats = teacher_hidden(engine, batch, 2)
            times[key].append(time.perf_counter() - start)
            times["switch" if engine is plain else "switch_prefetched"].append(stats["swap_s"])
            if engine is teacher2:
                times["overlap"].append(stats["overlap_s"])
    med = {k: statistics.median(v) for k, v in times.items()}
    med["bytes_mb"] = slot.nbytes / MB
    med["copy_gb_s"] = slot.nbytes / med["copy"] / GB
    return med


def step_rounds(student: EmbeddedTrainEngine, engine: EmbeddedTeacherEngine, path: str, args) -> dict:
    """T teachers of the three-teacher slot, the batch split between them, from teacher 0
    resident (so T - 1 swaps, as in a run's steady state where the last teacher stays)."""
    batch = batch_of(args.rows, args.tokens, engine.vocab, seed=2)
    times: dict[int, list[float]] = {t: [] for t in (1, 2, 3)}
    swaps: dict[int, float] = {}
    for _ in range(args.rounds):
        for count in times:
            term = gkd_term(path, count)
            engine.slot.switch(0)
            engine.slot.take_stats()
            start = time.perf_counter()
            extras, stats = teacher_hidden(engine, batch, count)
            b = TrainBatch(batch.input_ids, batch.attention_mask, batch.loss_mask, extras)
            student.train_step(b, lambda ctx: term.loss(ctx), logit_term=term.logit_term)
            times[count].append(time.perf_counter() - start)
            swaps[count] = stats["swaps"]
    base = statistics.median(times[1])
    return {str(t): {"step_s": statistics.median(v), "ratio": statistics.median(v) / base, "swaps": swaps[t]}
            for t, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=512, help="train.logprob_chunk_tokens")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    path = str(resolve_model_path(f"builtin:{args.model}"))
    student = EmbeddedTrainEngine(ModelConfig(path=path),
                                  TrainConfig(lr=0.0, micro_batch_size=args.micro_batch,
                                              logprob_chunk_tokens=args.chunk), device="cpu")
    with torch.no_grad():  # a student that differs from its teachers (see the module docstring)
        for param in student.model.parameters():
            param.add_(torch.randn_like(param) * 0.02)

    def slot(count: int, prefetch: bool = True) -> EmbeddedTeacherEngine:
        teachers = [{"name": f"t{i}", "path": path, "key": f"opd.teachers[{i}]"} for i in range(count)]
        return EmbeddedTeacherEngine(teachers, chunk_tokens=args.chunk, prefetch=prefetch, device="cpu")

    shared = slot(3)  # teachers 0..T-1 of it serve every measurement below
    results = {
        "model": args.model, "rows": args.rows, "tokens": args.tokens, "micro_batch": args.micro_batch,
        "memory": memory_rounds(student, shared, path, args),
        "swap": swap_rounds(shared, slot(2, prefetch=False), args),
        "step": step_rounds(student, shared, path, args),
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    mem, swap = results["memory"], results["swap"]
    print(f"{args.model}: {args.rows} rows x {args.tokens} tokens, micro-batch {args.micro_batch}, "
          f"chunk {args.chunk}, {args.rounds} rounds (medians)")
    print("full-vocab KL train step, peak RSS above settled:")
    for name in ("rebuilt", "materialised"):
        m = mem[name]
        print(f"  {name:13s} {m['peak_mb']:8.0f} MB   teacher ships {m['shipped_mb']:7.1f} MB   loss {m['loss']:.4f}")
    print(f"  materialised / rebuilt: {mem['ratio']:.2f}x")
    print(f"teacher swap, {swap['bytes_mb']:.0f} MB of weights:")
    print(f"  plain copy_ {swap['copy'] * 1e3:8.1f} ms ({swap['copy_gb_s']:.1f} GB/s, the limit)")
    print(f"  switch, no prefetch  {swap['switch'] * 1e3:8.1f} ms ({swap['switch'] / swap['copy']:.2f}x the copy)")
    print(f"  switch, prefetched   {swap['switch_prefetched'] * 1e3:8.1f} ms "
          f"({swap['switch_prefetched'] / swap['copy']:.2f}x the copy; {swap['overlap'] * 1e3:.1f} ms overlapped)")
    print(f"  two-teacher forward: {swap['forward_plain']:.2f} s without prefetch, "
          f"{swap['forward_prefetch']:.2f} s with ({swap['forward_prefetch'] / swap['forward_plain']:.3f}x)")
    print("step time (teacher forward + GKD train step), teachers sharing one slot:")
    for count, row in results["step"].items():
        print(f"  {count} teacher(s): {row['step_s']:.2f} s ({row['ratio']:.2f}x one teacher, {row['swaps']:.0f} swaps)")


if __name__ == "__main__":
    main()
