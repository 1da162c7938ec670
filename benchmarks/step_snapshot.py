"""What the step snapshot costs per step, beside the train phase it follows.

After every step that is not checkpointed the controller saves the trainer's state
(``controller/step_snapshot.py``: the checkpoint's own ``save``: safetensors weights, AdamW's
two moments and the RNG states in ``train_state.pt``), so an actor death loses at most the step
in flight. This measures that save against one GRPO train phase (``TrainStep`` on a batch
shaped like ``benchmarks/train_step.py``'s) on the same engine, in one process, and prints the
seconds of each (medians over rounds), their ratio, and the bytes the snapshot holds on disk.
The train phase alone understates a real step (rollout and weight sync come on top), so the
ratio is an upper bound on the snapshot's share of a step.

    .venv/bin/python benchmarks/step_snapshot.py [--model tiny|smollm2] [--rounds 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from loongsage.engines.openmp_wait import openmp_wait_env

os.environ.update(openmp_wait_env(os.environ))  # before torch loads OpenMP, as the CLI does

import torch  # noqa: E402

from loongsage.algorithms.objective import Objective  # noqa: E402
from loongsage.controller.step_snapshot import folder_bytes
from loongsage.controller.train_step import TrainStep
from loongsage.engines.distributed import RankShards
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.models.resolve import resolve_model_path
from loongsage.plugins import get_registries
from loongsage.schema import ModelConfig, TrainConfig
from train_step import main_job_batch


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    path = str(resolve_model_path(f"builtin:{args.model}"))
    engine = EmbeddedTrainEngine(ModelConfig(path=path), TrainConfig(lr=1e-5, micro_batch_size=8,
                                                                      num_threads=args.threads), device="cpu")
    objective = Objective(Objective.from_config({"policy_loss": {"name": "ppo_clip"}}, get_registries()).spec)
    batch, rewards, groups = main_job_batch(args.groups, args.samples, 60, 48, engine.model.config.vocab_size)
    shards = RankShards([torch.arange(len(batch))], [torch.zeros(len(batch), dtype=torch.bool)], 1)
    train_s, save_s, size = [], [], 0
    root = Path(tempfile.mkdtemp(dir=args.dir))
    try:
        for round_ in range(args.rounds):
            start = time.perf_counter()
            TrainStep(objective)(engine, (batch, rewards, groups), shards)
            train_s.append(time.perf_counter() - start)
            folder = root / f".snapshot_step_{round_:06d}" / "trainer"
            start = time.perf_counter()
            engine.save(folder)
            save_s.append(time.perf_counter() - start)
            size = folder_bytes(folder)
            shutil.rmtree(folder.parent)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    params = sum(p.numel() for p in engine.model.parameters())
    return {"model": args.model, "params": params, "train_s": statistics.median(train_s),
            "snapshot_s": statistics.median(save_s), "snapshot_bytes": size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", choices=["tiny", "smollm2"])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the snapshots are written (default: the temp dir)")
    args = parser.parse_args()
    r = run(args)
    print(f"{r['model']} ({r['params'] / 1e6:.1f}M params), {args.groups}x{args.samples} rows, {args.threads} threads, "
          f"medians of {args.rounds} rounds")
    print(f"  train phase {r['train_s']:.3f} s | snapshot save {r['snapshot_s']:.3f} s "
          f"({r['snapshot_s'] / r['train_s']:.2f}x the train phase) | {r['snapshot_bytes'] / 1e6:.1f} MB on disk "
          f"({r['snapshot_bytes'] / r['params']:.1f} bytes per parameter)")


if __name__ == "__main__":
    main()
