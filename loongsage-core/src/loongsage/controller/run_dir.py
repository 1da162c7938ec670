"""The run directory: resolved config, metrics, trajectory samples, checkpoints, resume.

Layout::

    <run_dir>/config.yaml            resolved, validated config
    <run_dir>/layout.json            which actor runs where (role, rank, bundle, node, GPUs, cores)
    <run_dir>/metrics.jsonl          one JSON object per step (jsonl tracker)
    <run_dir>/samples/step_000003.jsonl   decoded trajectories, token ids and per-token arrays
    <run_dir>/trajectories/<source>/trajectories.jsonl   every AgentFlow trajectory, token-exact
    <run_dir>/trajectories/<source>/rewards.jsonl        their rewards, written once scored
    <run_dir>/checkpoints/step_000003/    trainer state + controller state (state.json)
    <run_dir>/checkpoints/latest          name of the newest complete checkpoint
    <run_dir>/final_model/                the last checkpoint's model (hard links) + README.md card
    <run_dir>/.lock                       held (``flock``) by the live run, which wrote its pid in it

A run directory belongs to one run (``RunDirectory.claimed``): a second live run is refused
(the lock is the kernel's, so a killed run leaves nothing stuck), and so is a fresh run
(``trainer.resume=false``) in a directory holding another run's checkpoints or metrics: it
would mix its metrics with that run's and ``keep_last`` would prune its own new checkpoints
as older than the other run's. ``trainer.overwrite=true`` deletes that run's files first.

A checkpoint is written to a temporary folder, its manifest (every file's size and SHA-256,
``checkpoint_manifest``) last, then renamed into place, and ``latest`` is replaced atomically
afterwards, so a run killed mid-save resumes from the previous one. A resume verifies the
manifest of the newest checkpoint; a damaged one (a file missing, truncated or changed, or
``latest`` naming a folder that is gone) is named, moved aside as ``damaged_step_*`` (kept for
inspection, out of ``keep_last``'s count) and the run falls back to the newest intact one;
with none intact it fails naming every damaged one. A write that fails (a full disk) names
the file and why, removes its partial files and keeps the previous checkpoint.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

from omegaconf import DictConfig, OmegaConf

from loongsage.controller.checkpoint_manifest import checkpoint_bytes, problems, write_manifest
from loongsage.data.types import Group
from loongsage.engines.train_state import STATE_FILE
from loongsage.errors import ConfigError, LoongSageError

log = logging.getLogger(__name__)
MB = 1 << 20
# what a run writes at the top of its directory (trackers' defaults included): what
# ``trainer.overwrite`` deletes; anything else a user put there stays
RUN_ENTRIES = ("checkpoints", "samples", "trajectories", "final_model", "warm_start_model", "sft_model",
               "metrics.jsonl", "engine_events.jsonl", "config.yaml", "layout.json", "tensorboard", "mlruns",
               "mlflow_run_id")


class CheckpointDamaged(LoongSageError):
    """A resume found checkpoints, none of them intact; the message names each and why."""


class CheckpointWriteFailed(LoongSageError):
    """Writing a checkpoint failed; the message names the file, why, and what was kept."""


class RunDirectory:
    """Owns every file a run writes."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self.samples = self.path / "samples"

    @classmethod
    def for_config(cls, cfg: DictConfig) -> "RunDirectory":
        """The configured ``trainer.run_dir``, or a new timestamped folder under the run root."""
        if cfg.trainer.run_dir:
            path = Path(cfg.trainer.run_dir)
        else:
            name = cfg.logging.run_name or time.strftime("%Y%m%d-%H%M%S")
            path = Path(cfg.logging.run_root) / name
        run = cls(path.resolve())
        for folder in (run.path, run.checkpoints, run.samples):
            folder.mkdir(parents=True, exist_ok=True)
        return run

    @contextmanager
    def claimed(self, resume: bool, overwrite: bool) -> Iterator["RunDirectory"]:
        """Hold the directory for this run (see the module docstring); released on exit."""
        lock = open(self.path / ".lock", "a+", encoding="utf-8")
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.seek(0)
                owner = lock.read().strip() or "unknown"
                raise ConfigError("trainer.run_dir", f"{self.path} is in use by another live run (pid {owner}); "
                                  "wait for it to end, or give this run another trainer.run_dir") from None
            lock.seek(0)
            lock.truncate()
            lock.write(str(os.getpid()))
            lock.flush()
            if not resume:
                self._make_fresh(overwrite)
            yield self
        finally:
            lock.close()  # closing the file releases the lock

    def _make_fresh(self, overwrite: bool) -> None:
        checkpoints = sorted(p.name for p in self.checkpoints.glob("*step_*") if not p.name.startswith("."))
        metrics = self.path / "metrics.jsonl"
        rows = sum(1 for _ in open(metrics, "rb")) if metrics.is_file() else 0
        if not checkpoints and not rows:
            return
        if overwrite:
            for name in RUN_ENTRIES:
                entry = self.path / name
                if entry.is_dir():
                    shutil.rmtree(entry)
                elif entry.exists():
                    entry.unlink()
            for folder in (self.checkpoints, self.samples):
                folder.mkdir()
            log.warning(f"trainer.overwrite: deleted the previous run's files in {self.path}")
            return
        held = "; ".join(filter(None, [f"checkpoints {', '.join(checkpoints)}" if checkpoints else "",
                                       f"metrics.jsonl with {rows} rows" if rows else ""]))
        raise ConfigError("trainer.run_dir", f"{self.path} holds another run ({held}); a fresh run there would "
                          "mix its metrics with that run's and lose checkpoints to keep_last. Resume it "
                          "(trainer.resume=true), start in a new directory (another trainer.run_dir, or none "
                          "for a new timestamped one), or delete that run's files (trainer.overwrite=true)")

    def write_config(self, cfg: DictConfig) -> None:
        (self.path / "config.yaml").write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")

    def write_layout(self, mode: str, actors: list[dict]) -> None:
        """The actor layout of ``controller.placement.layout``."""
        payload = {"mode": mode, "actors": actors}
        (self.path / "layout.json").write_text(json.dumps(payload, indent=1), encoding="utf-8")

    def write_samples(self, step: int, groups: Iterable[Group], tokenizer: Any, limit: int) -> list[dict]:
        """Save up to ``limit`` trajectories of this step: decoded text, token ids and, aligned
        with ``response_ids``, the loss mask, the rollout engine's and the trainer's (pi_old)
        logprob, the weight version, the advantage and the value (a step term's baseline) of every
        response token (the last two empty where the step computed none: no RL loss, no values), and the
        seed its tokens were drawn with (``engines.sampling_seed``; null where the agent keeps none),
        the prompt's ground truth and its data source's other fields (``metadata``). Returns the rows."""
        rows = []
        for group in groups:
            for sample in group.samples:
                if len(rows) >= limit:
                    break
                rows.append(
                    {
                        "step": step,
                        "group_id": group.group_id,
                        "source": group.prompt.source,
                        "prompt_index": group.prompt.index,
                        "prompt": tokenizer.decode(sample.prompt_ids),
                        "ground_truth": group.prompt.ground_truth,
                        "metadata": group.prompt.metadata,
                        "response": tokenizer.decode(sample.response_ids),
                        "prompt_ids": sample.prompt_ids,
                        "response_ids": sample.response_ids,
                        "reward": sample.reward,
                        "reward_info": sample.reward_info,
                        "finish_reason": sample.finish_reason,
                        "loss_mask": sample.loss_mask,
                        "rollout_logprobs": sample.response_logprobs,
                        "train_logprobs": sample.train_logprobs,
                        "weight_versions": sample.weight_versions,
                        "advantages": sample.advantages,
                        "values": sample.values,
                        "sampling_seed": sample.sampling_seed,
                    }
                )
        path = self.samples / f"step_{step:06d}.jsonl"
        with open(path, "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row, default=str) + "\n" for row in rows)
        return rows

    def export_model(self, model_folder: Path, card: Any) -> Path:
        """``final_model/``: the HF files of ``model_folder`` (hard links, no second copy of the
        weights; the trainer state stays behind) and ``card`` saved as its README.md."""
        final = self.path / "final_model"
        tmp = self.path / ".final_model.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for file in model_folder.iterdir():
            if file.is_file() and file.name != STATE_FILE:
                try:
                    os.link(file, tmp / file.name)
                except OSError:  # another filesystem
                    shutil.copy2(file, tmp / file.name)
        card.save(tmp / "README.md")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        return final

    # checkpoints ---------------------------------------------------------------------

    def checkpoint_dir(self, step: int) -> Path:
        return self.checkpoints / f"step_{step:06d}"

    def write_checkpoint(self, step: int, write: Callable[[Path], None], state: dict, keep_last: int) -> Path:
        """``write(folder)`` fills a temporary folder; then the controller ``state`` (state.json)
        and the manifest are added, the folder renamed into place and ``latest`` pointed at it.
        Any failure before the rename removes the partial folder and raises
        ``CheckpointWriteFailed`` naming the file and the reason."""
        tmp = self.checkpoints / f".tmp_step_{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            write(tmp)
            (tmp / "state.json").write_text(json.dumps(state, default=_jsonable), encoding="utf-8")
            write_manifest(tmp)
        except Exception as err:
            raise self._write_failed(step, tmp, err) from err
        final = self.checkpoint_dir(step)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        self._point_latest_at(final)
        self._prune(keep_last)
        return final

    def latest_checkpoint(self) -> tuple[Path, dict] | None:
        """The newest complete checkpoint (file sizes against its manifest) and its state, or
        ``None``; quiet, for the run's own questions (is there one to resume from?)."""
        found, _ = self._search(checksums=False)
        return found

    def resume_checkpoint(self) -> tuple[Path, dict] | None:
        """The newest intact checkpoint (every file's size and SHA-256 checked), for a resume.

        Each damaged one is named in a warning and moved aside as ``damaged_step_*``, and the
        fallback said; ``CheckpointDamaged`` naming every damaged one when none is intact;
        ``None`` when there is no checkpoint at all."""
        found, damaged = self._search(checksums=True)
        for name, problem in damaged:
            log.warning(f"checkpoint {name} is damaged: {problem}")
        if found is None:
            if damaged:
                raise CheckpointDamaged(
                    f"no intact checkpoint to resume from in {self.checkpoints}: "
                    + "; ".join(f"{name}: {problem}" for name, problem in damaged)
                    + ". Restore one of them, or start a new run in a new trainer.run_dir")
            return None
        if damaged:
            for name, _ in damaged:
                if (self.checkpoints / name).is_dir():
                    (self.checkpoints / name).rename(self.checkpoints / f"damaged_{name}")
            self._point_latest_at(found[0])
            log.warning(f"falling back to {found[0].name}, the newest intact checkpoint (damaged ones moved "
                        f"aside as damaged_step_*)")
        return found

    def _search(self, checksums: bool) -> tuple[tuple[Path, dict] | None, list[tuple[str, str]]]:
        """The newest intact checkpoint (newest step first) and the damaged ones newer than it."""
        damaged: list[tuple[str, str]] = []
        marker = self.checkpoints / "latest"
        if marker.is_file():
            named = marker.read_text(encoding="utf-8").strip()
            if not (self.checkpoints / named).is_dir():
                damaged.append((named, "checkpoints/latest names it but the folder is gone"))
        for folder in sorted((p for p in self.checkpoints.glob("step_*") if p.is_dir()), reverse=True):
            found = problems(folder, checksums)
            if not found:
                try:
                    return (folder, json.loads((folder / "state.json").read_text(encoding="utf-8"))), damaged
                except ValueError as err:
                    found = [f"state.json is unreadable ({err})"]
            damaged.append((folder.name, "; ".join(found)))
        return None, damaged

    def _point_latest_at(self, folder: Path) -> None:
        latest_tmp = self.checkpoints / ".latest.tmp"
        latest_tmp.write_text(folder.name, encoding="utf-8")
        os.replace(latest_tmp, self.checkpoints / "latest")

    def _write_failed(self, step: int, tmp: Path, err: BaseException) -> CheckpointWriteFailed:
        """Name the file being written and why, remove the partial folder, say what is kept."""
        os_error = _os_error(err)
        written = [p for p in tmp.rglob("*") if p.is_file()]
        if os_error is not None and os_error.filename:
            file = Path(os_error.filename)
            file = file.relative_to(tmp) if file.is_relative_to(tmp) else file
        elif written:  # the one being written when it failed
            file = max(written, key=lambda p: p.stat().st_mtime_ns).relative_to(tmp)
        else:
            file = None
        shutil.rmtree(tmp, ignore_errors=True)
        previous = self.latest_checkpoint()
        free = shutil.disk_usage(self.checkpoints).free
        needed = checkpoint_bytes(previous[0]) if previous else None
        out_of_space = ((os_error is not None and os_error.errno == errno.ENOSPC)
                        or "no space left" in str(err).lower() or (needed is not None and free < needed))
        if out_of_space:
            wanted = f"{needed / MB:.0f} MB needed (the size of {previous[0].name}), " if needed else ""
            reason = f"no space left on device: {wanted}{free / MB:.0f} MB free in {self.checkpoints}"
        else:
            reason = f"{type(err).__name__}: {_first_line(err)}"
        where = f" writing {file}" if file is not None else ""
        kept = (f"the previous checkpoint {previous[0].name} is intact: resume with trainer.resume=true "
                f"trainer.run_dir={self.path}" if previous else "no earlier checkpoint exists")
        return CheckpointWriteFailed(f"checkpoint step_{step:06d} failed{where}: {reason}; its partial files "
                                     f"were removed; {kept}")

    def _prune(self, keep_last: int) -> None:
        done = sorted(p for p in self.checkpoints.glob("step_*") if p.is_dir())
        for old in done[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def _os_error(err: BaseException) -> OSError | None:
    """The ``OSError`` behind ``err``: itself, its cause, or what a Ray actor raised (``.cause``)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno is not None:
            return err
        err = getattr(err, "cause", None) or err.__cause__ or err.__context__
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _jsonable(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    if hasattr(value, "tolist"):  # a sample's routed experts (numpy)
        return value.tolist()
    raise TypeError(f"cannot store {type(value).__name__} in checkpoint state.json")
