"""Scale-out on one machine: one train rank against two, one weight-sync sender against two.

step   The tiny recipe (`loongsage train --config-name tiny/grpo`) with `train.dp_size=1` and
       with `train.dp_size=2` (DDP over gloo), colocated, one rollout engine per train rank
       (`rollout.num_engines` = dp_size), runs alternating (dp1, dp2, dp1, dp2, ...), so load
       from other processes hits both alike. Reported: medians over steps 1.. of
       `timing/step`, `timing/train`, `timing/rollout`, `timing/weight_sync`, and the cores
       and torch threads each actor had (from the run's `layout.json`).
sync   TransferMesh weight sync of a SmolLM2-135M-shaped state dict (fp32, 538 MB) from one
       sender process holding everything, and from two sender processes each holding the part
       `engines.mesh_sync.owners_by_size` gives it, into one receiver process on the same
       host (shared memory, zero-copy as in a run); interleaved rounds, median wall time from
       "sync" to every sender's report that the receiver applied the version.

    .venv/bin/python benchmarks/scale_out.py [--parts step sync] [--steps 8] [--rounds 2]
        [--reps 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).parent))
from runs import run_env  # noqa: E402
from transfer_mesh import MODELS, make_params, nbytes  # noqa: E402

from loongsage.engines.mesh_sync import owners_by_size  # noqa: E402
from loongsage.transfer import TransferConfig, TransferMesh, WeightReceiver  # noqa: E402
from loongsage.transfer.bucketing import ALIGN  # noqa: E402

STEP_KEYS = ("timing/step", "timing/train", "timing/rollout", "timing/weight_sync")


# ---- dp=1 vs dp=2 on the tiny recipe -------------------------------------------------------

def run_tiny(dp: int, steps: int, folder: Path) -> dict:
    run_dir = folder / f"dp{dp}-{time.monotonic_ns()}"
    cpus = "1.0" if dp == 1 else "0.5"  # colocated bundles fill the 2 cores either way
    args = [sys.executable, "-m", "loongsage.cli", "train", "--config-name", "tiny/grpo",
            f"trainer.run_dir={run_dir}", "logging.progress_bar=false", f"trainer.steps={steps}",
            "checkpoint.interval=0", "checkpoint.keep_last=1", f"train.dp_size={dp}",
            f"rollout.num_engines={dp}", f"placement.train_cpus={cpus}",
            f"placement.rollout_cpus={cpus}"]
    done = subprocess.run(args, env=run_env(), capture_output=True, text=True, timeout=3600)
    if done.returncode:
        raise RuntimeError(f"dp={dp} run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "timing/step" in r][1:]  # step 0 warms caches up
    layout = json.loads((run_dir / "layout.json").read_text())
    actors = [f"{a['role']}{a['rank']}: cores {a['cores']} x{a['torch_threads']} threads"
              for a in layout["actors"]]
    return {"times": {k: [r[k] for r in rows] for k in STEP_KEYS}, "actors": actors}


def bench_steps(steps: int, rounds: int) -> dict:
    samples = {1: {k: [] for k in STEP_KEYS}, 2: {k: [] for k in STEP_KEYS}}
    actors = {}
    with tempfile.TemporaryDirectory(prefix="scale-out-") as folder:
        for _ in range(rounds):
            for dp in (1, 2):
                result = run_tiny(dp, steps, Path(folder))
                actors[dp] = result["actors"]
                for key, values in result["times"].items():
                    samples[dp][key] += values
    medians = {dp: {k: statistics.median(v) for k, v in per.items()} for dp, per in samples.items()}
    return {"medians_s": medians, "actors": actors, "steps_measured": len(samples[1]["timing/step"]),
            "ratio_dp2_over_dp1": {k: medians[2][k] / medians[1][k] for k in STEP_KEYS}}


# ---- weight sync from one sender vs two ------------------------------------------------------

def _sender(cfg_name: str, rank: int, world: int, bucket: int, commands, replies) -> None:
    torch.set_num_threads(1)
    weights, _ = make_params(MODELS[cfg_name], "cpu")
    owners = owners_by_size([(n, t.numel() * t.element_size()) for n, t in weights.items()], world)
    part = [(n, t) for n, t in weights.items() if owners[n] == rank]
    slots = 2 + (sum(t.numel() * t.element_size() for _, t in part) + ALIGN * len(part)) // bucket
    mesh = TransferMesh(TransferConfig(bucket_bytes=bucket, num_slots=slots, timeout_s=300),
                        sender_rank=rank, host_id="bench-host").start()
    replies.put(mesh.address)
    mesh.wait_for_receivers(1, 300)
    while (version := commands.get()) is not None:
        report = mesh.sync(part, version)
        replies.put((report.seconds, report.payload_bytes, dict(report.failed)))
    mesh.close()


def _receiver(addresses, ready, stop) -> None:
    torch.set_num_threads(1)
    receiver = WeightReceiver(addresses, lambda named, version: None, host_id="bench-host",
                              timeout_s=300, zero_copy=True).start()
    ready.put("ready")
    stop.get()
    receiver.close()


class Senders:
    def __init__(self, cfg_name: str, world: int, bucket: int) -> None:
        ctx = mp.get_context("spawn")
        self.commands = [ctx.Queue() for _ in range(world)]
        self.replies = [ctx.Queue() for _ in range(world)]
        self.procs = [ctx.Process(target=_sender, args=(cfg_name, r, world, bucket,
                                                        self.commands[r], self.replies[r]))
                      for r in range(world)]
        for proc in self.procs:
            proc.start()
        addresses = [q.get(timeout=600) for q in self.replies]
        self.ready, self.stop = ctx.Queue(), ctx.Queue()
        self.receiver = ctx.Process(target=_receiver, args=(addresses, self.ready, self.stop))
        self.receiver.start()
        self.ready.get(timeout=600)
        self.version = 0

    def sync(self) -> float:
        self.version += 1
        start = time.perf_counter()
        for queue in self.commands:
            queue.put(self.version)
        reports = [q.get(timeout=600) for q in self.replies]
        wall = time.perf_counter() - start
        failed = [r[2] for r in reports if r[2]]
        if failed:
            raise RuntimeError(f"sync {self.version} failed: {failed}")
        return wall

    def close(self) -> None:
        for queue in self.commands:
            queue.put(None)
        self.stop.put("stop")
        for proc in [*self.procs, self.receiver]:
            proc.join(60)


def bench_sync(reps: int, cfg_name: str = "smollm2-135m", bucket: int = 64 << 20) -> dict:
    setups = {1: Senders(cfg_name, 1, bucket), 2: Senders(cfg_name, 2, bucket)}
    try:
        for setup in setups.values():
            setup.sync()  # the first version is copied into staging, later ones are zero-copy
            setup.sync()
        times = {world: [] for world in setups}
        for _ in range(reps):
            for world, setup in setups.items():
                times[world].append(setup.sync())
    finally:
        for setup in setups.values():
            setup.close()
    medians = {world: statistics.median(t) for world, t in times.items()}
    size = nbytes(make_params(MODELS[cfg_name], "cpu")[0])
    return {"model": cfg_name, "bytes": size, "reps": reps, "median_s": medians,
            "gb_per_s": {w: size / s / 1e9 for w, s in medians.items()},
            "ratio_2_over_1": medians[2] / medians[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["step", "sync"], choices=["step", "sync"])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = {"cores": len(os.sched_getaffinity(0)), "load_average": os.getloadavg()}
    if "sync" in args.parts:
        out["sync"] = bench_sync(args.reps)
    if "step" in args.parts:
        out["step"] = bench_steps(args.steps, args.rounds)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{out['cores']} cores, load average {out['load_average'][0]:.1f}")
    if "sync" in out:
        s = out["sync"]
        print(f"weight sync, {s['model']} ({s['bytes'] / 1e6:.0f} MB), median of {s['reps']}:")
        for world in (1, 2):
            print(f"  {world} sender(s): {s['median_s'][world]:.3f} s ({s['gb_per_s'][world]:.2f} GB/s)")
        print(f"  2 senders / 1 sender: {s['ratio_2_over_1']:.2f}x the time")
    if "step" in out:
        s = out["step"]
        print(f"tiny recipe, {s['steps_measured']} steps each, medians (s):")
        print("  " + " | ".join(["dp"] + [k.split("/")[1] for k in STEP_KEYS]))
        for dp in (1, 2):
            print(f"  {dp} | " + " | ".join(f"{s['medians_s'][dp][k]:.2f}" for k in STEP_KEYS))
        print("  dp2/dp1 | " + " | ".join(f"{s['ratio_dp2_over_dp1'][k]:.2f}x" for k in STEP_KEYS))
        for dp in (1, 2):
            print(f"  dp={dp} actors: " + "; ".join(s["actors"][dp]))


if __name__ == "__main__":
    main()
