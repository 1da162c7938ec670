"""Read what a run directory holds, for the viewer: config, metrics, saved samples per step and
the AgentFlow trajectories (segments, messages, rewards) the samples came from.

Files are read on every call, so the viewer follows a run that is still writing. A saved
sample (``samples/step_*.jsonl``, written by ``controller.run_dir.RunDirectory.write_samples``)
carries its response tokens with, aligned, the loss mask, the rollout engine's logprob, the
trainer's pi_old logprob and the weight version of each; a router-based sample's
``reward_info`` names its trajectory and segment, joined here with
``trajectories/<source>/trajectories.jsonl`` and ``rewards.jsonl``.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator

from loongsage.errors import LoongSageError
from loongsage.tracking.jsonl import read_metrics


def _jsonl(path: Path) -> Iterator[dict]:
    """The complete lines of a JSONL file that may still be growing."""
    if not path.is_file():
        return
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                return


def mean_advantage(row: dict) -> float | None:
    """The sample's advantage: the mean over its trained tokens (GRPO's is one value per
    sample; GAE's varies per token), None where the step computed none."""
    mask = row.get("loss_mask") or []
    trained = [a for a, m in zip(row.get("advantages") or [], mask) if m and a is not None]
    return sum(trained) / len(trained) if trained else None


def sample_summary(row: dict, index: int) -> dict[str, Any]:
    """What the sample table lists: ids, source, reward, advantage, lengths, versions, a text preview."""
    mask = row.get("loss_mask") or []
    versions = [v for v in row.get("weight_versions") or [] if v >= 0]
    return {
        "step": row["step"], "index": index, "source": row.get("source"), "group_id": row.get("group_id"),
        "prompt_index": row.get("prompt_index"), "reward": row.get("reward"), "advantage": mean_advantage(row),
        "length": len(row.get("response_ids") or []), "trained_tokens": int(sum(mask)),
        "finish_reason": row.get("finish_reason"),
        "versions": sorted(set(versions)), "trajectory_id": (row.get("reward_info") or {}).get("trajectory_id"),
        "preview": (row.get("response") or "")[:120],
    }


def token_rows(row: dict, decode: Any) -> list[dict[str, Any]]:
    """One entry per response token: id, text, mask, both logprobs, their gap, weight version, advantage."""
    ids = row.get("response_ids") or []
    n = len(ids)
    mask = row.get("loss_mask") or [1] * n
    rollout = row.get("rollout_logprobs") or [None] * n
    train = row.get("train_logprobs") or [None] * n
    versions = row.get("weight_versions") or [None] * n
    advantages = row.get("advantages") or [None] * n
    out = []
    for i, token in enumerate(ids):
        sampled = bool(mask[i])
        r = rollout[i] if sampled else None
        t = train[i] if sampled else None
        out.append({"i": i, "id": token, "text": decode(token), "mask": int(mask[i]), "rollout_logprob": r,
                    "train_logprob": t, "gap": None if r is None or t is None else t - r,
                    "version": versions[i], "advantage": advantages[i] if sampled else None})
    return out


class RunFiles:
    """The files of one run directory (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).resolve()
        if not (self.path / "config.yaml").is_file() and not (self.path / "metrics.jsonl").is_file():
            raise LoongSageError(f"{self.path} is not a run directory (no config.yaml, no metrics.jsonl)")

    def config(self) -> dict[str, Any]:
        from omegaconf import OmegaConf

        path = self.path / "config.yaml"
        return OmegaConf.to_container(OmegaConf.load(path), resolve=False) if path.is_file() else {}

    def metrics(self) -> list[dict]:
        return read_metrics(self.path / "metrics.jsonl")

    def sample_files(self) -> dict[int, Path]:
        return {int(p.stem.split("_")[-1]): p for p in sorted((self.path / "samples").glob("step_*.jsonl"))}

    def samples(self, step: int) -> list[dict]:
        path = self.sample_files().get(step)
        if path is None:
            raise LoongSageError(f"no samples saved for step {step} in {self.path / 'samples'}")
        return list(_jsonl(path))

    def steps(self) -> list[dict[str, Any]]:
        """Each step with saved samples: how many, their sources and mean reward (a step that
        saved none, such as the final evaluation's row, is left out)."""
        out = []
        for step in self.sample_files():
            rows = self.samples(step)
            if not rows:
                continue
            rewards = [r["reward"] for r in rows if isinstance(r.get("reward"), (int, float))]
            out.append({"step": step, "samples": len(rows), "sources": sorted({r.get("source") for r in rows}),
                        "reward_mean": sum(rewards) / len(rewards) if rewards else None})
        return out

    def find_samples(self, step: int | None = None, source: str | None = None,
                     min_reward: float | None = None, max_reward: float | None = None,
                     min_length: int | None = None, max_length: int | None = None,
                     group_id: int | None = None) -> list[dict[str, Any]]:
        """Summaries of the saved samples passing every given filter, by step then index."""
        steps = [step] if step is not None else list(self.sample_files())
        out = []
        for s in steps:
            for index, row in enumerate(self.samples(s)):
                summary = sample_summary(row, index)
                reward, length = summary["reward"], summary["length"]
                if source is not None and summary["source"] != source:
                    continue
                if group_id is not None and summary["group_id"] != group_id:
                    continue
                if (min_reward is not None and reward < min_reward) or (max_reward is not None and reward > max_reward):
                    continue
                if (min_length is not None and length < min_length) or (max_length is not None and length > max_length):
                    continue
                out.append(summary)
        return out

    @cached_property
    def _tokenizer(self) -> Any:
        model = self.config().get("model") or {}
        path = model.get("tokenizer_path") or model.get("path")
        try:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(path) if path and Path(path).is_dir() else None
        except (OSError, ValueError):
            return None

    def decode(self, token: int) -> str:
        """One token as text with the run's tokenizer (``<id>`` when the model folder is gone)."""
        return self._tokenizer.decode([token]) if self._tokenizer is not None else f"<{token}>"

    def trajectory(self, source: str, trajectory_id: str, attempt_id: str) -> dict[str, Any] | None:
        """A persisted AgentFlow trajectory with its reward row (``None`` when not persisted)."""
        folder = self.path / "trajectories" / source
        found = next((t for t in _jsonl(folder / "trajectories.jsonl")
                      if t.get("trajectory_id") == trajectory_id and t.get("attempt_id") == attempt_id), None)
        if found is None:
            return None
        reward = next((r for r in _jsonl(folder / "rewards.jsonl")
                       if r.get("trajectory_id") == trajectory_id and r.get("attempt_id") == attempt_id), None)
        return {"trajectory_id": trajectory_id, "attempt_id": attempt_id, "status": found.get("status"),
                "error": found.get("error"), "reward": found.get("reward"), "reward_row": reward,
                "segments": found.get("segments") or [], "metadata": found.get("metadata") or {}}

    def sample_detail(self, step: int, index: int) -> dict[str, Any]:
        rows = self.samples(step)
        if not 0 <= index < len(rows):
            raise LoongSageError(f"step {step} has {len(rows)} saved samples; no sample {index}")
        row = rows[index]
        tokens = token_rows(row, self.decode)
        info = row.get("reward_info") or {}
        trajectory = None
        if "trajectory_id" in info:
            trajectory = self.trajectory(row.get("source"), str(info["trajectory_id"]), str(info.get("attempt_id", "0")))
        group = [sample_summary(other, i) for i, other in enumerate(rows)
                 if other.get("group_id") == row.get("group_id") and other.get("source") == row.get("source")]
        return {**sample_summary(row, index), "prompt": row.get("prompt"), "response": row.get("response"),
                "ground_truth": row.get("ground_truth"), "metadata": row.get("metadata") or {},
                "reward_info": info, "tokens": tokens, "segment_id": info.get("segment_id"),
                "trajectory": trajectory, "group": group}
