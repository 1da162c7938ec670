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

A checkpoint is written to a temporary folder and renamed into place, and ``latest`` is
replaced atomically afterwards, so a run killed mid-save resumes from the previous one.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable

from omegaconf import DictConfig, OmegaConf

from loongsage.data.types import Group
from loongsage.engines.embedded_train_state import STATE_FILE


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

    def write_config(self, cfg: DictConfig) -> None:
        (self.path / "config.yaml").write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")

    def write_layout(self, mode: str, actors: list[dict]) -> None:
        """The actor layout of ``controller.placement.layout``."""
        payload = {"mode": mode, "actors": actors}
        (self.path / "layout.json").write_text(json.dumps(payload, indent=1), encoding="utf-8")

    def write_samples(self, step: int, groups: Iterable[Group], tokenizer: Any, limit: int) -> list[dict]:
        """Save up to ``limit`` trajectories of this step: decoded text, token ids and, aligned
        with ``response_ids``, the loss mask, the rollout engine's and the trainer's (pi_old)
        logprob, the weight version, the advantage and the critic's value of every response
        token (the last two empty where the step computed none: no RL loss, no critic), and the
        prompt's ground truth and its data source's other fields (``metadata``). Returns the rows."""
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

    def begin_checkpoint(self, step: int) -> Path:
        tmp = self.checkpoints / f".tmp_step_{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        return tmp

    def commit_checkpoint(self, step: int, tmp: Path, state: dict, keep_last: int) -> Path:
        """Write controller state, move the folder into place, point ``latest`` at it."""
        (tmp / "state.json").write_text(json.dumps(state, default=_jsonable), encoding="utf-8")
        final = self.checkpoint_dir(step)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        latest_tmp = self.checkpoints / ".latest.tmp"
        latest_tmp.write_text(final.name, encoding="utf-8")
        os.replace(latest_tmp, self.checkpoints / "latest")
        self._prune(keep_last)
        return final

    def latest_checkpoint(self) -> tuple[Path, dict] | None:
        marker = self.checkpoints / "latest"
        if not marker.exists():
            return None
        folder = self.checkpoints / marker.read_text(encoding="utf-8").strip()
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
        return folder, state

    def _prune(self, keep_last: int) -> None:
        done = sorted(p for p in self.checkpoints.glob("step_*") if p.is_dir())
        for old in done[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    if hasattr(value, "tolist"):  # a sample's routed experts (numpy)
        return value.tolist()
    raise TypeError(f"cannot store {type(value).__name__} in checkpoint state.json")
