"""The last finished step kept on disk, so an actor death loses at most the step in flight.

In the default layout (colocated, ``placement.share_process``) each rollout engine lives in
its train rank's process: a SIGKILL of the process that serves the engine's ``/health`` is
the train rank's death too, and the trainer's state since the last checkpoint
(``checkpoint.interval``) went with it. ``StepSnapshot`` saves the trainer's state (and the
step terms', ``save_state``) after every step that is not checkpointed anyway, with the same
``save`` a checkpoint uses, into ``checkpoints/.snapshot_step_N``, and keeps the controller's state of
that step (step, weight version, the scheduler's data order) in the driver. It is no
checkpoint: ``latest`` does not name it and ``keep_last`` does not count it; each new one
replaces the previous one once it is complete. When a later step fails with the train actor
gone, ``FailureGuard`` promotes it (``promote``: its files moved into the checkpoint of its
step, which ``RunDirectory.write_checkpoint`` completes with the state and the manifest), and ``trainer.auto_resume`` continues from the step after it.

Why disk and not host memory: the same bytes (weights, the optimizer's moments, RNG states)
held in the driver or Ray's object store would count against the node's RAM for the whole
run, and the trainer's existing save and load restore them bit for bit with no second
format to keep in step. The cost is one trainer save per step and one more checkpoint's
size on disk (docs/reliability.md has the figures; ``close`` logs this run's).
``checkpoint.snapshot=false`` turns it off.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loongsage.controller.lifecycle import controller_state, save_actor_state

log = logging.getLogger(__name__)

PREFIX = ".snapshot_step_"


@dataclass
class _Kept:
    step: int
    folder: Path
    state: dict


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


class StepSnapshot:
    """The newest finished step's state of ``run`` (see the module docstring)."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.kept: _Kept | None = None
        self.seconds: list[float] = []
        self.size = 0
        for stale in run.run_dir.checkpoints.glob(f"*{PREFIX}*"):  # a driver killed before it could promote
            shutil.rmtree(stale, ignore_errors=True)

    def take(self, step: int) -> None:
        """Save the state after ``step``, then drop the previous snapshot."""
        start = time.perf_counter()
        checkpoints = self.run.run_dir.checkpoints
        tmp, folder = checkpoints / f".tmp{PREFIX}{step:06d}", checkpoints / f"{PREFIX}{step:06d}"
        for stale in (tmp, folder):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_actor_state(self.run, tmp)
        tmp.rename(folder)  # complete, or not there at all
        self.discard()
        self.kept = _Kept(step, folder, controller_state(self.run, step))
        self.seconds.append(time.perf_counter() - start)
        self.size = folder_bytes(folder)

    def promote(self) -> int | None:
        """Make the snapshot the checkpoint of its step when it is newer than the latest
        checkpoint; return that step (None when there was nothing newer to promote)."""
        latest = self.run.run_dir.latest_checkpoint()
        if self.kept is None or (latest is not None and latest[1]["step"] >= self.kept.step):
            return None
        kept, self.kept = self.kept, None

        def move_in(folder: Path) -> None:  # the snapshot's files become the checkpoint's
            for part in kept.folder.iterdir():
                part.rename(folder / part.name)

        self.run.run_dir.write_checkpoint(kept.step, move_in, kept.state, self.run.cfg.checkpoint.keep_last)
        shutil.rmtree(kept.folder, ignore_errors=True)
        return kept.step

    def discard(self) -> None:
        if self.kept is not None:
            shutil.rmtree(self.kept.folder, ignore_errors=True)
            self.kept = None

    def close(self) -> None:
        """Remove what is left and log what the snapshots cost this run."""
        self.discard()
        if self.seconds:
            log.info(f"step snapshots: {len(self.seconds)} saved, {sum(self.seconds) / len(self.seconds):.2f} s "
                     f"each (longest {max(self.seconds):.2f} s), {self.size / 1e6:.1f} MB on disk")
