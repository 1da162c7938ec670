"""The train-actor side of on-policy distillation: a ``StepTerm`` (``loongsage.plugin.StepTerm``).

With Q the student, P the row's teacher, m the loss mask of rows whose source names a
teacher, A the RL advantage and KL_t the chosen method's per-token divergence
(baidu-baige/LoongSage ``docs/en/on-policy-distillation.md``):

    PG-style    Â_t = A_t − λ_pg · sg(KL_t) · m_t          (opd.pg_ratio, opd.pg_kl_method)
    GKD-style   L_GKD = agg(KL_t, m)                        (opd.gkd_kl_method, loss_agg_mode)
    mixed       L = (1 − λ_gkd) · L_RL + λ_gkd · L_GKD       (opd.gkd_ratio; 1 skips L_RL)

The PG penalty is computed from the π_old forward at step start, the GKD loss from every
micro-batch of the train forward. Token-level methods (k1, k2, k3) compare the sampled
token's log-probs; logit-level ones (``kl_methods``) run inside the engine's chunked LM head
as a ``LogitTerm`` against the teacher's top-k, or against its full distribution rebuilt
from its hidden states with its own LM head (``teacher_heads``). λ_gkd does not scale a
reference-KL term inside L_RL separately: the whole RL loss is scaled.

Metrics (token means over m, overall and ``/<source>`` per data source): ``opd/kl``,
``opd/topk_overlap`` (logit-level methods: the share of the teacher's top-k tokens in the
student's), ``opd/teacher_entropy``, ``opd/entropy_gap`` (student − teacher entropy), all
from the GKD forward when there is one, else from the π_old forward; ``opd/pg_kl`` from the
π_old forward; ``opd/loss`` = L_GKD. Micro-batches report sums and token counts, which the
engine adds up; ``finish_metrics`` divides them, so the means do not depend on the split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from loongsage.plugin import LogitTerm, LossContext, PluginRef, TrainBatch, aggregate

from loongsage_distill.kl_methods import topk_overlap
from loongsage_distill.teacher_heads import teacher_logprobs

TEACHER, SOURCE = "opd_teacher", "opd_source"  # [N] long: teacher index (-1: none), source index
LOGPROBS, ENTROPY = "teacher_logprobs", "teacher_entropy"  # [N, L]
TOPK_LOGPROBS, TOPK_IDS = "teacher_topk_logprobs", "teacher_topk_ids"  # [N, L, k]
HIDDEN = "teacher_hidden"  # [N, L, H]
SUM, TOKENS = "opd_sum", "opd_tokens"  # raw per-phase sums and counts, divided by finish_metrics
PHASES = ("gkd", "pg")


@dataclass(frozen=True)
class TeacherTargets:
    """How a logit-level method reads its teacher: the batch extras it needs, and a function
    turning one chunk of them into ``(teacher_logprobs, teacher_ids)`` for the method."""

    inputs: tuple[str, ...]
    read: Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def _read_topk(term: "KLColumns", logits: torch.Tensor, topk_logprobs: torch.Tensor, ids: torch.Tensor):
    return topk_logprobs, ids.long()


def _read_full(term: "KLColumns", logits: torch.Tensor, hidden: torch.Tensor, teacher: torch.Tensor):
    return teacher_logprobs(hidden, teacher, term.head_paths, term.fp32, logits.shape[-1]), None


TARGETS = {
    "topk": TeacherTargets((TOPK_LOGPROBS, TOPK_IDS), _read_topk),
    "full": TeacherTargets((HIDDEN, TEACHER), _read_full),
}


@dataclass(frozen=True)
class KLColumns:
    """A ``LogitTerm`` function: per position, the method's divergence and the top-k overlap."""

    method: PluginRef
    beta: float
    topk: int
    head_paths: tuple[str, ...]
    fp32: bool

    @property
    def targets(self) -> TeacherTargets:
        return TARGETS[self.method.trait("kl_targets")]

    def __call__(self, logits: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        teacher, ids = self.targets.read(self, logits, *inputs)
        kl = self.method.obj(logits, teacher, ids, self.beta)
        with torch.no_grad():
            top = ids if ids is not None else teacher.topk(min(self.topk, teacher.shape[-1]), dim=-1).indices
            overlap = topk_overlap(logits, top)
        return torch.stack([kl, overlap], dim=-1)


def kl_logit_term(method: PluginRef | None, columns: dict[str, Any]) -> LogitTerm | None:
    if method is None or method.trait("kl_targets") not in TARGETS:
        return None
    fn = KLColumns(method, **columns)
    return LogitTerm(fn, fn.targets.inputs, width=2)


def _sums(phase: str, values: dict[str, torch.Tensor], mask: torch.Tensor, source: torch.Tensor,
          names: tuple[str, ...]) -> dict[str, float]:
    """Masked sums of per-token ``values`` and the token counts, overall and per source."""
    out: dict[str, float] = {}
    scopes = [("", mask)] + [(f"/{name}", mask * (source == i).unsqueeze(-1).to(mask.dtype))
                             for i, name in enumerate(names)]
    for scope, m in scopes:
        out[f"{TOKENS}/{phase}{scope}"] = float(m.sum())
        for metric, value in values.items():
            out[f"{SUM}/{phase}/{metric}{scope}"] = float((value.detach() * m).sum())
    return out


@dataclass(frozen=True)
class OPDTerm:
    """Multi-teacher PG / GKD / mixed distillation in the train actor (module docstring)."""

    pg_ratio: float
    gkd_ratio: float
    pg_method: PluginRef | None
    gkd_method: PluginRef | None
    beta: float
    topk: int
    head_paths: tuple[str, ...]  # resolved model folder per teacher index
    fp32: bool  # model.fp32_lm_head: teacher heads in fp32
    source_names: tuple[str, ...]
    loss_agg_mode: str
    loss_agg_norm_len: float | None
    needs_entropy: bool = True

    @property
    def rl_weight(self) -> float:
        return 1.0 - self.gkd_ratio

    def _columns(self) -> dict[str, Any]:
        return {"beta": self.beta, "topk": self.topk, "head_paths": self.head_paths, "fp32": self.fp32}

    @property
    def old_logit_term(self) -> LogitTerm | None:
        return kl_logit_term(self.pg_method, self._columns())

    @property
    def logit_term(self) -> LogitTerm | None:
        return kl_logit_term(self.gkd_method, self._columns())

    def _mask(self, batch: TrainBatch) -> torch.Tensor:
        has_teacher = (batch.extras[TEACHER] >= 0).to(batch.loss_mask.dtype)
        return batch.loss_mask * has_teacher.unsqueeze(-1)

    def _per_token(self, method: PluginRef, batch: TrainBatch, logprobs: torch.Tensor,
                   entropy: torch.Tensor | None, values: torch.Tensor | None) -> tuple[torch.Tensor, dict]:
        """The method's per-token divergence and the per-token statistics for the metrics."""
        extras = batch.extras
        teacher_entropy = extras[ENTROPY].to(logprobs.dtype)
        stats = {"teacher_entropy": teacher_entropy}
        if entropy is not None:
            stats["entropy_gap"] = entropy - teacher_entropy
        if values is not None:
            kl = values[..., 0]
            stats["topk_overlap"] = values[..., 1]
        else:
            kl = method.obj(logprobs, extras[LOGPROBS].detach().to(logprobs.dtype))
        stats["kl"] = kl
        return kl, stats

    def shape_advantages(self, batch: TrainBatch, advantages: torch.Tensor,
                         old: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        if self.pg_method is None:
            return advantages, {}
        mask = self._mask(batch)
        kl, stats = self._per_token(self.pg_method, batch, old["logprobs"], old.get("entropy"),
                                    old.get("logit_values"))
        shaped = advantages - self.pg_ratio * kl.detach().to(advantages.dtype) * mask
        return shaped, _sums("pg", stats, mask, batch.extras[SOURCE], self.source_names)

    def loss(self, ctx: LossContext) -> tuple[torch.Tensor, dict[str, float]]:
        if self.gkd_method is None:
            return ctx.logprobs.new_zeros(()), {}
        batch = ctx.batch
        mask = self._mask(batch).to(ctx.logprobs.dtype)
        kl, stats = self._per_token(self.gkd_method, batch, ctx.logprobs, ctx.entropy, ctx.logit_values)
        loss = aggregate(kl, mask, self.loss_agg_mode, ctx.global_num_tokens, ctx.global_num_seqs,
                         norm_len=self.loss_agg_norm_len)
        metrics = {"opd/loss": float(loss.detach())}
        metrics.update(_sums("gkd", stats, mask, batch.extras[SOURCE], self.source_names))
        return self.gkd_ratio * loss, metrics

    def finish_metrics(self, metrics: dict[str, Any]) -> dict[str, float]:
        """Means from the raw sums: the GKD forward's as ``opd/<metric>``, the π_old forward's
        as ``opd/pg_kl`` (and as ``opd/<metric>`` when there is no GKD loss)."""
        out = {k: v for k, v in metrics.items() if not k.startswith((SUM + "/", TOKENS + "/"))}
        means: dict[str, dict[str, float]] = {phase: {} for phase in PHASES}
        for key, total in metrics.items():
            if not key.startswith(SUM + "/"):
                continue
            phase, name = key[len(SUM) + 1:].split("/", 1)
            scope = name[len(name.split("/", 1)[0]):]
            tokens = metrics[f"{TOKENS}/{phase}{scope}"]
            if tokens > 0:
                means[phase][name] = total / tokens
        primary = means["gkd"] or means["pg"]
        out.update({f"opd/{name}": value for name, value in primary.items()})
        out.update({f"opd/pg_{name}": value for name, value in means["pg"].items() if name.startswith("kl")})
        return out
