"""TransferMesh throughput against the physical limit and against tensor-by-tensor sending.

Two parameter sets shaped like real checkpoints (HF names and shapes, random values):
  smollm2-135m  Llama, hidden 576, 30 layers, vocab 49152, fp32 (the CPU engines run fp32)
  qwen2.5-0.5b  Qwen2, hidden 896, 24 layers, vocab 151936, bf16 (as released)
For each, side by side in one run, with the receiver in a separate process:
  memcpy            one flat copy of the same number of bytes into a warm buffer (the limit)
  mesh shm / gloo   TransferMesh.sync, full version, until the receiver verified it
  mesh shm zero-copy  the same with `WeightReceiver(zero_copy=True)` and a ring that holds a
                    whole version: the receiver hands views of the shared segment to apply
                    instead of copying each bucket into staging (one copy in transport, not two)
  mesh * delta      TransferMesh.sync after a realistic optimizer step (Adam's first step,
                    lr 1e-6, on an fp32 master copy; bf16 weights change only where the step
                    crosses a bf16 rounding boundary)
  per-tensor queue  torch.multiprocessing.Queue, one put per tensor, receiver copies each
  per-tensor pipe   one pickled (name, tensor) message per tensor over a multiprocessing Pipe
  per-tensor gloo   one gloo broadcast per tensor into preallocated tensors (the shape of
                    SGLang's `/update_weights_from_distributed` without flattened buckets)
  mesh cuda_ipc / nccl  on a CUDA machine (cuda_ipc: receiver on the sender's GPU; nccl: needs
                    a second GPU); on other machines the table says why they were skipped.
Full-sync methods run interleaved (every round runs each method once; medians reported), so
load from other processes on a shared machine hits them alike.
The apply callback only records the version, so every row stops at "bytes are in the
receiver's memory, verified"; the engine's own copy into its parameters is the same for all.
`--apply-copy` makes the mesh receivers' apply copy every tensor into warm parameter tensors
(what `EmbeddedRolloutEngine.apply_weights` does), for end-to-end figures. Copies of the bytes
per full sync: memcpy 1; mesh shm 2 (+1 with --apply-copy); mesh shm zero-copy 1 (+1).

    .venv/bin/python benchmarks/transfer_mesh.py [--models smollm2-135m] [--reps 5]
        [--transports shm gloo baselines] [--apply-copy] [--json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import pickle
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from loongsage.transfer import TransferConfig, TransferMesh, WeightReceiver
from loongsage.transfer.bucketing import ALIGN
from loongsage.transfer.transports import TRANSPORTS

MODELS = {
    "smollm2-135m": dict(hidden=576, layers=30, inter=1536, heads=9, kv_heads=3, vocab=49152,
                         bias=False, dtype=torch.float32),
    "qwen2.5-0.5b": dict(hidden=896, layers=24, inter=4864, heads=14, kv_heads=2, vocab=151936,
                         bias=True, dtype=torch.bfloat16),
}


def layout(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    h, head = cfg["hidden"], cfg["hidden"] // cfg["heads"]
    kv = cfg["kv_heads"] * head
    shapes = [("model.embed_tokens.weight", (cfg["vocab"], h))]
    for i in range(cfg["layers"]):
        p = f"model.layers.{i}."
        for proj, rows in (("q_proj", h), ("k_proj", kv), ("v_proj", kv)):
            shapes.append((f"{p}self_attn.{proj}.weight", (rows, h)))
            if cfg["bias"]:
                shapes.append((f"{p}self_attn.{proj}.bias", (rows,)))
        shapes += [(f"{p}self_attn.o_proj.weight", (h, h)),
                   (f"{p}mlp.gate_proj.weight", (cfg["inter"], h)),
                   (f"{p}mlp.up_proj.weight", (cfg["inter"], h)),
                   (f"{p}mlp.down_proj.weight", (h, cfg["inter"])),
                   (f"{p}input_layernorm.weight", (h,)),
                   (f"{p}post_attention_layernorm.weight", (h,))]
    shapes.append(("model.norm.weight", (h,)))
    return shapes


def make_params(cfg: dict, device: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(weights in the model dtype, fp32 master); the same dict twice for an fp32 model."""
    g = torch.Generator().manual_seed(0)
    master = {name: (torch.randn(shape, generator=g) * 0.02).to(device)
              for name, shape in layout(cfg)}
    if cfg["dtype"] == torch.float32:
        return master, master
    return {name: t.to(cfg["dtype"]) for name, t in master.items()}, master


def optimizer_step(weights: dict, master: dict, lr: float = 1e-6) -> float:
    """Adam's first step is exactly lr * sign(grad); returns the fraction of elements changed."""
    changed = total = 0
    for name, m in master.items():
        sign = torch.randint(0, 2, m.shape, device=m.device, dtype=torch.int8) * 2 - 1
        m.add_(sign, alpha=-lr)
        w = weights[name]
        if w is not m:
            new = m.to(w.dtype)
            changed += int((new.view(torch.int16) != w.view(torch.int16)).sum())
            w.copy_(new)
        else:
            changed += m.numel()
        total += m.numel()
    return changed / total


def nbytes(weights: dict) -> int:
    return sum(t.numel() * t.element_size() for t in weights.values())


# ---- receiver processes ------------------------------------------------------------------

def _mesh_receiver(address, host_id: str, device: str, ready, stop, zero_copy: bool,
                   apply_copy: bool) -> None:
    torch.set_num_threads(1)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    params: dict[str, torch.Tensor] = {}

    def apply(named, version) -> None:
        for name, tensor in named:
            if not apply_copy:
                continue
            if name in params:
                params[name].copy_(tensor)
            else:
                params[name] = tensor.clone()

    receiver = WeightReceiver([address], apply, host_id=host_id, device=device, timeout_s=300,
                              zero_copy=zero_copy).start()
    ready.put(receiver.transports)
    stop.get()
    ready.put(receiver.zero_copy_versions)
    receiver.close()


def _staging(shapes, dtype) -> dict[str, torch.Tensor]:
    return {name: torch.empty(shape, dtype=dtype).zero_() for name, shape in shapes}


def _queue_receiver(shapes, dtype, inbox, acks) -> None:
    torch.set_num_threads(1)
    staging = _staging(shapes, dtype)
    while (item := inbox.get()) is not None:
        if item == "end":
            acks.put("ok")
            continue
        name, tensor = item
        staging[name].copy_(tensor)
        del tensor


def _pipe_receiver(shapes, dtype, conn) -> None:
    torch.set_num_threads(1)
    staging = _staging(shapes, dtype)
    while (data := conn.recv_bytes()) != b"stop":
        if data == b"end":
            conn.send_bytes(b"ok")
            continue
        name, tensor = pickle.loads(data)
        staging[name].copy_(tensor)


def _gloo_receiver(shapes, dtype, port: int, commands) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False,
                          timeout=datetime.timedelta(seconds=300))
    group = _gloo_group(store, 1)
    staging = list(_staging(shapes, dtype).values())
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    while commands.get() == "sync":
        for tensor in staging:
            group.broadcast([tensor], opts).wait()
        group.barrier().wait()


def _gloo_group(store: dist.Store, rank: int):
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = datetime.timedelta(seconds=300)
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(dist.PrefixStore("bench", store), rank, 2, opts)


# ---- methods: each starts its receiver once, then `sync()` moves one version -------------

class Memcpy:
    """One flat copy of the same number of bytes between two warm buffers (the limit)."""

    def __init__(self, weights: dict):
        device = next(iter(weights.values())).device
        self.src = torch.empty(nbytes(weights), dtype=torch.uint8, device=device).random_()
        self.dst = torch.empty_like(self.src)

    def sync(self) -> None:
        self.dst.copy_(self.src)
        if self.dst.is_cuda:
            torch.cuda.synchronize()

    def close(self) -> None:
        del self.src, self.dst


class MeshMethod:
    """TransferMesh.sync into a receiver process that reports (host_id, device)."""

    def __init__(self, weights: dict, *, transport: str, host_id: str, device: str,
                 bucket_bytes: int, delta: bool = False, zero_copy: bool = False,
                 apply_copy: bool = False):
        ctx = mp.get_context("spawn")
        self.weights, self.ready, self.stop = weights, ctx.Queue(), ctx.Queue()
        sender_device = str(next(iter(weights.values())).device)
        # zero-copy needs one version in the ring: every tensor may add ALIGN bytes of padding
        slots = 2 + (nbytes(weights) + ALIGN * len(weights)) // bucket_bytes if zero_copy else 2
        self.mesh = TransferMesh(TransferConfig(bucket_bytes=bucket_bytes, delta=delta,
                                                num_slots=slots, timeout_s=300),
                                 host_id="bench-host", device=sender_device).start()
        self.proc = ctx.Process(target=_mesh_receiver, args=(self.mesh.address, host_id,
                                                             device, self.ready, self.stop,
                                                             zero_copy, apply_copy))
        self.proc.start()
        chosen = self.ready.get(timeout=300)
        if chosen.get(0) != transport:
            raise RuntimeError(f"expected transport {transport}, the mesh chose {chosen}")
        self.versions = iter(range(1, 1 << 30))
        self.last = None

    def sync(self) -> None:
        report = self.mesh.sync(self.weights.items(), next(self.versions))
        if report.failed or not report.applied:
            raise RuntimeError(f"sync failed: {report.failed}")
        self.last = report

    def close(self) -> None:
        self.stop.put("stop")
        self.zero_copy_versions = self.ready.get(timeout=60)
        self.proc.join(60)
        self.mesh.close()


class QueuePerTensor:
    """torch.multiprocessing.Queue, one put per tensor (shared-memory handles after the first
    put moved the sender's storages into shared memory); the receiver copies each tensor."""

    def __init__(self, weights: dict):
        ctx = mp.get_context("spawn")
        self.weights, self.inbox, self.acks = weights, ctx.Queue(), ctx.Queue()
        first = next(iter(weights.values()))
        shapes = [(n, tuple(t.shape)) for n, t in weights.items()]
        self.proc = ctx.Process(target=_queue_receiver, args=(shapes, first.dtype, self.inbox,
                                                              self.acks))
        self.proc.start()

    def sync(self) -> None:
        for item in self.weights.items():
            self.inbox.put(item)
        self.inbox.put("end")
        self.acks.get()

    def close(self) -> None:
        self.inbox.put(None)
        self.proc.join(60)


class PipePerTensor:
    """One pickled (name, tensor) message per tensor over a multiprocessing Pipe."""

    def __init__(self, weights: dict):
        ctx = mp.get_context("spawn")
        self.weights = weights
        self.conn, child = ctx.Pipe()
        first = next(iter(weights.values()))
        shapes = [(n, tuple(t.shape)) for n, t in weights.items()]
        self.proc = ctx.Process(target=_pipe_receiver, args=(shapes, first.dtype, child))
        self.proc.start()

    def sync(self) -> None:
        for item in self.weights.items():
            self.conn.send_bytes(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))
        self.conn.send_bytes(b"end")
        self.conn.recv_bytes()

    def close(self) -> None:
        self.conn.send_bytes(b"stop")
        self.proc.join(60)


class GlooPerTensor:
    """One gloo broadcast per tensor into preallocated tensors (SGLang's per-tensor
    `/update_weights_from_distributed` receive, minus the HTTP call)."""

    def __init__(self, weights: dict):
        ctx = mp.get_context("spawn")
        self.weights, self.commands = weights, ctx.Queue()
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        first = next(iter(weights.values()))
        shapes = [(n, tuple(t.shape)) for n, t in weights.items()]
        self.proc = ctx.Process(target=_gloo_receiver, args=(shapes, first.dtype, store.port,
                                                             self.commands))
        self.proc.start()
        self.store, self.group = store, _gloo_group(store, 0)
        self.opts = dist.BroadcastOptions()
        self.opts.rootRank = 0

    def sync(self) -> None:
        self.commands.put("sync")
        for tensor in self.weights.values():
            self.group.broadcast([tensor], self.opts).wait()
        self.group.barrier().wait()

    def close(self) -> None:
        self.commands.put("stop")
        self.proc.join(60)


def interleaved(methods: dict[str, object], reps: int) -> dict[str, float]:
    """Median seconds per method; each round runs every method once, so load from other
    processes on a shared machine hits all methods alike."""
    for method in methods.values():
        method.sync()
    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(reps):
        for name, method in methods.items():
            start = time.perf_counter()
            method.sync()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def delta_after_steps(weights, master, reps: int, **mesh_kwargs) -> dict:
    method = MeshMethod(weights, delta=True, **mesh_kwargs)
    try:
        method.sync()
        seconds, payload, changed = [], [], []
        for _ in range(reps):
            changed.append(optimizer_step(weights, master))
            method.sync()
            if method.last.base_version is None:
                raise RuntimeError("expected a delta sync, the mesh sent a full version")
            seconds.append(method.last.seconds)
            payload.append(method.last.payload_bytes)
    finally:
        method.close()
    return {"seconds": statistics.median(seconds), "payload_bytes": int(statistics.median(payload)),
            "changed_fraction": statistics.median(changed)}


# ---- driver ------------------------------------------------------------------------------

def run_model(name: str, reps: int, bucket_bytes: int, device: str, only: set[str],
              apply_copy: bool = False) -> dict:
    cfg = MODELS[name]
    weights, master = make_params(cfg, device)
    total = nbytes(weights)
    skipped: dict[str, str] = {}
    cuda = device.startswith("cuda")
    plan = ([("cuda_ipc", "bench-host", device), ("nccl", "bench-remote", "cuda:1")] if cuda
            else [("shm", "bench-host", "cpu"), ("gloo", "bench-remote", "cpu")])
    for transport in TRANSPORTS:
        if transport not in {t for t, _, _ in plan}:
            skipped[transport] = TRANSPORTS[transport].available() or \
                f"sender tensors on {device}; rerun with --device {_other(device)}"
    methods: dict[str, object] = {"memcpy (limit)": Memcpy(weights)}
    kwargs = {}
    for transport, host_id, recv_device in plan:
        reason = TRANSPORTS[transport].available() if transport in only \
            else "not selected (--transports)"
        if transport == "nccl" and not reason and torch.cuda.device_count() < 2:
            reason = "NCCL needs a second GPU for the receiver"
        if reason:
            skipped[transport] = reason
            continue
        kwargs[transport] = dict(transport=transport, host_id=host_id, device=recv_device,
                                 bucket_bytes=bucket_bytes, apply_copy=apply_copy)
        methods[f"mesh {transport}"] = MeshMethod(weights, **kwargs[transport])
        if transport == "shm":
            methods["mesh shm zero-copy"] = MeshMethod(weights, zero_copy=True,
                                                       **kwargs[transport])
    if not cuda and "baselines" in only:
        methods["per-tensor mp.Queue"] = QueuePerTensor(weights)
        methods["per-tensor Pipe pickle"] = PipePerTensor(weights)
        methods["per-tensor gloo broadcast"] = GlooPerTensor(weights)
    try:
        seconds = interleaved(methods, reps)
    finally:
        for method in methods.values():
            method.close()
    rows = [{"method": m, "seconds": s, "gb_per_s": total / s / 1e9} for m, s in seconds.items()]
    for row in rows:
        if row["method"].endswith("zero-copy"):  # of 1 warm-up + reps syncs; the first copies
            row["zero_copy_syncs"] = methods[row["method"]].zero_copy_versions
    for transport in kwargs:
        if transport != "nccl":
            result = delta_after_steps(weights, master, reps, **kwargs[transport])
            rows.append({"method": f"mesh {transport} delta", **result,
                         "gb_per_s": total / result["seconds"] / 1e9})
    limit = rows[0]["seconds"]
    for r in rows:
        r["x_memcpy"] = r["seconds"] / limit
    return {"model": name, "dtype": str(cfg["dtype"]).removeprefix("torch."),
            "tensors": len(weights), "bytes": total, "rows": rows, "skipped": skipped}


def _other(device: str) -> str:
    return "cpu" if device.startswith("cuda") else "cuda"


def print_table(result: dict) -> None:
    print(f"\n{result['model']}: {result['tensors']} tensors, {result['bytes'] / 1e6:.0f} MB "
          f"{result['dtype']}")
    print(f"  {'method':<28}{'s/sync':>9}{'GB/s':>8}{'x memcpy':>10}  note")
    for r in result["rows"]:
        note = ""
        if "zero_copy_syncs" in r:
            note = f"{r['zero_copy_syncs']} of the timed syncs applied from views"
        if "payload_bytes" in r:
            note = (f"{r['changed_fraction'] * 100:.1f}% elements changed, sent "
                    f"{r['payload_bytes'] / 1e6:.1f} MB")
        print(f"  {r['method']:<28}{r['seconds']:>9.3f}{r['gb_per_s']:>8.2f}"
              f"{r['x_memcpy']:>10.2f}  {note}")
    for transport, reason in result["skipped"].items():
        print(f"  skipped {transport}: {reason}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--bucket-mb", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--transports", nargs="+", default=[*TRANSPORTS, "baselines"],
                        choices=[*TRANSPORTS, "baselines"])
    parser.add_argument("--apply-copy", action="store_true",
                        help="mesh receivers copy into warm parameter tensors (end to end)")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args(argv)
    device = "cuda:0" if args.device == "cuda" else args.device
    results = [run_model(name, args.reps, args.bucket_mb << 20, device,
                         set(args.transports), args.apply_copy) for name in args.models]
    out = {"benchmark": "transfer_mesh", "device": device, "threads": torch.get_num_threads(),
           "apply_copy": args.apply_copy,
           "bucket_mb": args.bucket_mb, "reps": args.reps, "models": results}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"TransferMesh benchmark on {device}, {torch.get_num_threads()} torch threads, "
              f"{args.bucket_mb} MiB buckets, median of {args.reps}"
              f"{', apply copies into parameters' if args.apply_copy else ''}")
        for result in results:
            print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
