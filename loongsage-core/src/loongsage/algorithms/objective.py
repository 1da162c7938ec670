"""The training objective: policy loss × IS correction, masks, aggregation, KL term.

For one micro-batch (a ``LossContext``) the objective computes

    ℓ_t      = policy_loss(π_θ, π_old, π_roll, Â)_t · Π_c w_{c,t}      (IS weights, detached)
    keep_t   = keep_policy_loss_t · Π_c keep_{c,t}                     (M2PO, IS mask, OPSM)
    L_pg     = agg(ℓ, loss_mask, keep)                                 (``loss_agg_mode``)
    L_kl     = agg(kl_method(π_θ, π_ref), loss_mask)                   (``kl.use_as = loss``)
    L        = L_pg + kl.coef · L_kl

with global denominators (``aggregation``), so the sum over micro-batches and ranks is the
full mini-batch loss. A run's step term (``step_term``: a plugin extending the training step,
e.g. a distillation loss) joins:

    L        = w_RL · L + L_term             (w_RL = term.rl_weight; 0 skips L and its inputs)

where the term returns its own weighted share. The KL term is aggregated with the same mode but ignores the keep
mask (a sequence masked for its policy-gradient signal still stays close to the reference).

Returned metrics are additive shares (sum them over micro-batches, see ``metrics``):
``train/loss``, ``train/pg_loss``, ``train/kl_loss`` (when used), ``train/keep_frac``,
``train/is_approx_k3_kl`` and ``train/is_logprob_abs_diff`` (always: token means of the
rollout/training mismatch, ``mismatch``), plus each component's own metrics.

``Objective.prepare(batch)`` must be called once per mini-batch (or per step, on the whole
batch) after ``old_logprobs`` and ``advantages`` are set and before the batch is split: it
runs the batch-level ``prepare`` of the components that have one (M2PO's mask), so their
statistics do not depend on the micro-batch split.

The object is picklable (it holds module-level callables and parameter dataclasses), so
it can be shipped to a Ray train actor as its ``loss_fn``.
"""

from __future__ import annotations

from typing import Any

import torch

from loongsage.algorithms.aggregation import aggregate, seq_metric, token_metric
from loongsage.algorithms.mismatch import mismatch_metrics
from loongsage.algorithms.step_term import StepTerm
from loongsage.algorithms.types import PolicyLossInputs
from loongsage.algorithms.validate import AlgorithmSpec, validate_algorithm
from loongsage.registry import Registries
from loongsage.engines.batch import TrainBatch

REQUIRED_EXTRAS = ("old_logprobs", "rollout_logprobs", "advantages")


class Objective:
    """``loss_fn(ctx) -> (loss, metrics)`` composed from the ``algorithm`` config."""

    def __init__(self, spec: AlgorithmSpec, term: StepTerm | None = None):
        self.spec = spec
        self.term = term

    @classmethod
    def from_config(cls, algorithm_cfg: Any, registries: Registries) -> "Objective":
        """The objective of an ``algorithm`` section (tests, notebooks); runs hold the spec."""
        return cls(validate_algorithm(algorithm_cfg, registries))

    @property
    def needs_reference(self) -> bool:
        """True when reference-model logprobs (``extras["ref_logprobs"]``) are needed."""
        return self.spec.needs_reference and self.rl_weight > 0

    def old_from_loss_forward(self, mini_batches: int) -> bool:
        """True when π_old may be taken, detached, from the loss forward itself.

        π_old is the trainer's weights at step start. When the batch is one optimizer
        step (``mini_batches == 1``) every micro-batch's loss forward runs on those very
        weights, so ``sg(π_θ)`` *is* π_old, bit for bit, whether the samples came from the
        current weights or (async, partial rollout) from older ones: the behaviour policy
        is ``rollout_logprobs``, never π_old. The separate no-grad forward is needed only
        when π_old is read before the loss (``AlgorithmSpec.needs_old_logprobs_before_loss``)
        or by a step term, or when later mini-batches train on moved weights.
        """
        return (mini_batches == 1 and self.rl_weight > 0 and self.term is None
                and not self.spec.needs_old_logprobs_before_loss)

    @property
    def rl_weight(self) -> float:
        """Weight of the RL loss: 1, or the step term's ``rl_weight`` (0: no RL at all)."""
        return 1.0 if self.term is None else float(self.term.rl_weight)

    def prepare(self, batch: TrainBatch) -> TrainBatch:
        """Add batch-level tensors (e.g. ``m2po_keep``) to ``batch.extras``; returns ``batch``."""
        if self.rl_weight == 0:
            return batch
        extras = batch.extras
        missing = [k for k in REQUIRED_EXTRAS if k not in extras]
        if missing:
            raise KeyError(f"Objective.prepare: TrainBatch.extras lacks {missing}")
        old = extras["old_logprobs"].detach()
        inputs = PolicyLossInputs(
            logprobs=old, old_logprobs=old, rollout_logprobs=extras["rollout_logprobs"].detach(),
            advantages=extras["advantages"].detach(), mask=batch.loss_mask.to(old.dtype), extras=extras,
        )
        for comp in (self.spec.policy_loss, *self.spec.corrections):
            prep = getattr(comp.obj, "prepare", None)
            if prep is not None:
                extras.update(prep(inputs, comp.params))
        return batch

    def _inputs(self, ctx: Any) -> PolicyLossInputs:
        extras = ctx.batch.extras
        missing = [k for k in REQUIRED_EXTRAS if k not in extras]
        if self.spec.kl_as_loss and "ref_logprobs" not in extras:
            missing.append("ref_logprobs")
        if missing:
            raise KeyError(
                f"loss_fn: TrainBatch.extras lacks {missing} (policy loss "
                f"'{self.spec.policy_loss.name}', kl {self.spec.kl_method} coef {self.spec.kl_coef})"
            )
        mask = ctx.batch.loss_mask.to(ctx.logprobs.dtype)
        return PolicyLossInputs(
            logprobs=ctx.logprobs,
            old_logprobs=extras["old_logprobs"].detach().to(ctx.logprobs.dtype),
            rollout_logprobs=extras["rollout_logprobs"].detach().to(ctx.logprobs.dtype),
            advantages=extras["advantages"].detach().to(ctx.logprobs.dtype),
            mask=mask,
            extras=extras,
        )

    def __call__(self, ctx: Any) -> tuple[torch.Tensor, dict[str, float]]:
        total, metrics = ctx.logprobs.new_zeros(()), {}
        if self.rl_weight > 0:
            rl, metrics = self._rl_loss(ctx)
            total = self.rl_weight * rl
        if self.term is not None:
            term, term_metrics = self.term.loss(ctx)
            total = total + term
            metrics.update(term_metrics)
        metrics["train/loss"] = float(total.detach())
        return total, metrics

    def _rl_loss(self, ctx: Any) -> tuple[torch.Tensor, dict[str, float]]:
        spec = self.spec
        inputs = self._inputs(ctx)
        mask = inputs.mask
        out = spec.policy_loss.obj(inputs, spec.policy_loss.params)
        tensors = dict(mismatch_metrics(inputs.old_logprobs, inputs.rollout_logprobs))
        tensors.update(out.metrics)
        weight = torch.ones_like(mask)
        keep = torch.ones_like(mask) if out.keep is None else out.keep.detach().to(mask.dtype)
        for comp in spec.corrections:
            corr = comp.obj(inputs, comp.params)
            if corr.weight is not None:
                weight = weight * corr.weight.detach()
            if corr.keep is not None:
                keep = keep * corr.keep.detach().to(mask.dtype)
            tensors.update(corr.metrics)

        n_tok, n_seq = ctx.global_num_tokens, ctx.global_num_seqs
        agg = dict(mode=spec.loss_agg_mode, global_num_tokens=n_tok, global_num_seqs=n_seq,
                   norm_len=spec.loss_agg_norm_len)
        pg = aggregate(out.loss * weight, mask, keep=keep, **agg)
        total = pg
        metrics: dict[str, float] = {"train/pg_loss": float(pg.detach())}
        if spec.kl_as_loss:
            ref = ctx.batch.extras["ref_logprobs"].detach().to(ctx.logprobs.dtype)
            kl = aggregate(spec.kl_fn(ctx.logprobs, ref), mask, **agg)
            total = total + spec.kl_coef * kl
            metrics["train/kl_loss"] = float(kl.detach())
        tensors["train/keep_frac"] = keep
        for name, value in tensors.items():
            reduce = token_metric if value.dim() == 2 else seq_metric
            metrics[name] = reduce(value, mask, n_tok if value.dim() == 2 else n_seq)
        return total, metrics
