"""Recompute one step of a finished run, in this process, and set it beside what the run logged.

``replay_step(run_dir, step)`` loads the trainer checkpoint taken after step ``step - 1`` (the
weights, optimizer and learning-rate schedule the step started from) and the step's recorded
batch (``controller.recording``, kept by ``rollout.record=true``), rebuilds the batch and its
shards exactly as the run did (``batching.plan_shards`` with the step as offset,
``groups_to_batch``) and runs the run's own training step (``train_step.TrainStep``)
on the run's train engine class, with the torch thread count the run's train rank had
(``layout.json``) and the same compute-thread set-up (``cpu_threads.prepare_compute_thread``):
pi_old log-probabilities, advantages, the loss terms, the gradient norm and every ``train/``
metric come out as the run computed them; on CPU they are bitwise equal.

``overrides`` recompute the same step under another setting: ``group/option=name`` picks
another plugin of a config group (``algorithm/policy_loss=gspo``: GSPO with its defaults) and
``dotted.key=value`` sets one value (``algorithm.policy_loss.eps_high=0.4``,
``algorithm.kl.coef=0.1``). ``dump`` writes the step's per-token tensors (ids, masks, rollout
and pi_old log-probabilities, their difference, advantages, weight versions) with ``torch.save``.

Only what one train rank computes alone is replayed: a run with ``train.dp_size`` above 1 or
with step terms (``config.step_terms``: inputs from actors of their own, a value model) is
refused with the reason.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
import yaml

CHECKPOINTS = "checkpoints"


@dataclass
class ReplayResult:
    """The recomputed ``train/`` metrics beside the logged ones of the same step."""

    step: int
    recomputed: dict[str, float]
    logged: dict[str, float]
    overrides: tuple[str, ...] = ()
    dumped: Path | None = None
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    def rows(self) -> list[tuple[str, float | None, float | None, float | None]]:
        """(metric, logged, replayed, replayed - logged) for every ``train/`` metric of either."""
        out = []
        for key in sorted(set(self.recomputed) | set(self.logged)):
            logged, again = self.logged.get(key), self.recomputed.get(key)
            diff = again - logged if logged is not None and again is not None else None
            out.append((key, logged, again, diff))
        return out

    def table(self) -> str:
        title = f"step {self.step}" + (f" under {' '.join(self.overrides)}" if self.overrides else "")
        lines = [title, f"{'metric':<34} {'logged':>16} {'replayed':>16} {'difference':>12}"]
        for key, logged, again, diff in self.rows():
            lines.append(f"{key:<34} {_num(logged):>16} {_num(again):>16} {_num(diff, 3):>12}")
        return "\n".join(lines)


def _num(value: float | None, digits: int = 9) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if math.isfinite(value) else str(value)


def apply_overrides(cfg: Any, overrides: Sequence[str]) -> Any:
    """``cfg`` (an OmegaConf config) with ``group/option=name`` and ``dotted.key=value`` applied."""
    from omegaconf import OmegaConf

    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--override {item!r}: expected key=value (algorithm/policy_loss=gspo, "
                             "algorithm.kl.coef=0.1)")
        if "/" in key:  # a config group: the plugin named, with its default parameters
            OmegaConf.update(cfg, key.replace("/", "."), {"name": value}, merge=False)
        else:
            OmegaConf.update(cfg, key, yaml.safe_load(value), merge=False)
    return cfg


@dataclass
class ReplayConfig:
    """What a replay needs of the run's config: the config itself, its algorithm, its train
    engine class and its data sources' names. Rewards and agents are not resolved: the recorded
    batch holds the rewards, so a run scored by a callable of its own replays as well."""

    cfg: Any
    algorithm: Any
    train_engine: Any
    sources: list[str]
    step_terms: tuple[str, ...]  # the sections of the run's step terms


def load_run_config(run_dir: Path, overrides: Sequence[str] = ()) -> ReplayConfig:
    """The run's resolved ``config.yaml`` with ``overrides``, its algorithm validated as ``train``
    validates it."""
    from omegaconf import OmegaConf

    from loongsage.algorithms.validate import validate_algorithm
    from loongsage.config.compose import publish_plugin_params
    from loongsage.config.step_terms import validate_step_terms
    from loongsage.plugins import load_plugins

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not a run directory (no config.yaml)")
    registries = load_plugins()
    publish_plugin_params(registries)
    cfg = apply_overrides(OmegaConf.load(path), overrides)
    terms = validate_step_terms(cfg, registries)
    return ReplayConfig(cfg, validate_algorithm(cfg.algorithm, registries),
                        registries.resolve("engine", cfg.train.backend, "train.backend").obj,
                        [str(source.name) for source in cfg.data_sources],
                        tuple(term.section for term in terms))


def _start_checkpoint(run_dir: Path, step: int) -> Path:
    if step < 1:
        raise ValueError(f"--step {step}: replay starts from the checkpoint of the step before, so "
                         "the first step it can replay is 1")
    folder = Path(run_dir) / CHECKPOINTS / f"step_{step - 1:06d}" / "trainer"
    if not folder.is_dir():
        have = sorted(p.name for p in (Path(run_dir) / CHECKPOINTS).glob("step_*"))
        raise FileNotFoundError(f"{folder}: replaying step {step} needs the checkpoint of step {step - 1} "
                                f"(the run has {have or 'none'}); train with checkpoint.interval=1 and "
                                "checkpoint.keep_last large enough to keep it")
    return folder


def _train_threads(run_dir: Path) -> int:
    layout = json.loads((Path(run_dir) / "layout.json").read_text(encoding="utf-8"))
    ranks = [a for a in layout["actors"] if a.get("role") == "train" and a.get("rank") == 0]
    return int(ranks[0]["torch_threads"]) if ranks else 0


def _logged(run_dir: Path, step: int) -> dict[str, float]:
    from loongsage.tracking.jsonl import read_metrics

    rows = [r for r in read_metrics(Path(run_dir) / "metrics.jsonl") if r.get("step") == step]
    if not rows:
        raise ValueError(f"{run_dir}/metrics.jsonl has no row for step {step}")
    return {k: v for k, v in rows[-1].items() if k.startswith("train/") and k != "train/weight_version"}


def _refuse_unsupported(spec: ReplayConfig) -> None:
    cfg = spec.cfg
    if cfg.train.dp_size != 1:
        raise ValueError(f"train.dp_size={cfg.train.dp_size}: replay recomputes what one train rank "
                         "computes; replay a run trained with train.dp_size=1")
    if spec.step_terms:
        raise ValueError(f"the run's training step has step terms (sections {list(spec.step_terms)}): replay "
                         "does not recompute the inputs they add to a batch nor the models they train")


def replay_step(run_dir: Path | str, step: int, overrides: Sequence[str] = (),
                dump: Path | str | None = None) -> ReplayResult:
    """Recompute ``step`` of the run in ``run_dir``; see the module docstring."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from loongsage.algorithms.objective import Objective
    from loongsage.controller.batching import groups_to_batch, plan_shards
    from loongsage.controller.recording import load_batch
    from loongsage.controller.train_step import TrainStep
    from loongsage.engines.cpu_threads import prepare_compute_thread
    from loongsage.engines.distributed import combine_rank_metrics
    from loongsage.runtime.partial import mask_offpolicy_tokens

    run_dir = Path(run_dir)
    checkpoint = _start_checkpoint(run_dir, step)
    groups = load_batch(run_dir, step)
    spec = load_run_config(run_dir, overrides)
    _refuse_unsupported(spec)
    cfg = spec.cfg
    logged = _logged(run_dir, step)

    prepare_compute_thread(_train_threads(run_dir))
    engine = spec.train_engine.from_config(OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)),
                                               device="cpu")
    engine.load(str(checkpoint))
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    ordered, shards = plan_shards(groups, spec.sources, cfg.train.mini_batches_per_step, 1, offset=step)
    if cfg.rollout.mask_offpolicy_in_partial_rollout:
        mask_offpolicy_tokens(ordered)
    batch, rewards, group_index = groups_to_batch(ordered, pad)
    train_step = TrainStep(Objective(spec.algorithm))
    metrics, kept = train_step(engine, (batch, rewards, group_index), shards, keep_rows=range(len(batch)))
    recomputed = combine_rank_metrics([metrics])
    tensors = _per_token(batch, kept)
    dumped = None
    if dump is not None:
        dumped = Path(dump)
        dumped.parent.mkdir(parents=True, exist_ok=True)
        torch.save(tensors, dumped)
    return ReplayResult(step, recomputed, logged, tuple(overrides), dumped, tensors)


def _per_token(batch: Any, kept: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """The step's per-token tensors, ``[rows, length]`` in the batch's layout (prompt, then
    response; zeros outside the loss mask where a value is only defined on response tokens)."""
    out = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
           "loss_mask": batch.loss_mask, "rollout_logprobs": batch.extras["rollout_logprobs"],
           "weight_versions": batch.extras["weight_versions"]}
    if kept is not None:
        out["old_logprobs"] = kept["train_logprobs"]
        out["advantages"] = kept["advantages"]
        out["old_minus_rollout_logprobs"] = (kept["train_logprobs"] - out["rollout_logprobs"]) * batch.loss_mask
    return out
