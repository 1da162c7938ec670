"""The training step: one object, shipped into every train-engine actor, that runs one RL step there.

``TrainStep(objective)(engine, data, shards, keep_rows)`` is the whole step inside the train
actor, so tensors never leave its process:

    log-probs (π_old, π_ref) → advantages → the step term's advantage shaping
    → loss (objective + the step term's loss) → optimizer steps → metrics

The step term (``loongsage.algorithms.step_term``: what a ``step_term`` plugin adds, e.g.
distillation) rides in ``objective.term``; its inputs were written into ``TrainBatch.extras``
on the controller side before the step (``StepExtension.before_train``,
``loongsage.config.step_terms``). The controller around it only orchestrates:
generate → step → publish (``controller.run``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from loongsage.algorithms.advantages import compute_advantages
from loongsage.algorithms.objective import Objective
from loongsage.engines.batch import TrainBatch
from loongsage.engines.distributed import RankShards


@dataclass(frozen=True)
class TrainStep:
    """One RL step of one train rank (module docstring); picklable, it travels to the actor."""

    objective: Objective

    def __call__(
        self,
        engine: Any,
        data: tuple[TrainBatch, torch.Tensor, torch.Tensor],
        shards: RankShards,
        keep_rows: Sequence[int] = (),
    ) -> tuple[dict[str, float], dict[str, torch.Tensor] | None]:
        """pi_old (and reference) logprobs at step start, advantages, then the optimizer steps.

        When the step is one optimizer step with nothing reading pi_old before the loss
        (``Objective.old_from_loss_forward``), pi_old comes detached from the loss forward
        itself and no separate forward runs (the same values: the weights have not moved yet).

        ``data`` is the step's whole batch (with per-sample rewards and group index); this rank
        computes the logprobs of its own rows (``shards``) and all-gathers them, so advantages
        and ``objective.prepare`` see the whole batch on every rank, then trains its rows.
        Advantages are computed after the logprobs because a KL penalty used as a reward
        (``algorithm.kl.use_as=reward``) needs pi_old and pi_ref first, and a step term's
        advantage shaping needs the pi_old forward's values. Without an RL loss
        (``objective.rl_weight == 0``) none of this runs: the optimizer steps on the term's
        loss and no pi_old logprobs are kept (None). Returns the step's metrics (this rank's
        share; a step term's raw sums become means once the ranks' shares are added, in
        ``finish_metrics``) and, of the batch rows ``keep_rows`` (the samples the run
        directory saves), the pi_old logprobs (``train_logprobs``) and the advantages the step
        trained with, so only those rows cross back from the actor (None without an RL loss).
        """
        objective = self.objective
        batch, rewards, group_index = data
        parallel, rank = engine.parallel, engine.parallel.rank
        term = objective.term
        entropy = {"with_entropy": term.needs_entropy} if term is not None else {}
        fused = objective.old_from_loss_forward(shards.mini_batches) and not engine.needs_pi_old_forward
        metrics: dict[str, float] = {}
        if objective.rl_weight > 0:
            local = shards.local_batch(batch, rank)
            if objective.needs_reference:
                ref = engine.compute_ref_logprobs(local)
                batch.extras["ref_logprobs"] = parallel.gather_rows(ref, shards, len(batch))
            old = {} if fused else _old_logprobs(engine, local, batch, shards, entropy, term)
            advantages = compute_advantages(
                rewards,
                group_index,
                batch.loss_mask,
                objective.spec,
                old_logprobs=batch.extras.get("old_logprobs"),
                ref_logprobs=batch.extras.get("ref_logprobs"),
                values=batch.extras.get("values"),  # the value model's, when the estimator needs them
            )
            if term is not None:
                advantages, metrics = term.shape_advantages(batch, advantages, old)
            batch.extras["advantages"] = advantages
            if not fused:
                objective.prepare(batch)  # batch-level statistics (M2PO's mask) before any split
        loss_term = {"logit_term": term.logit_term} if term is not None else {}
        local = shards.local_batch(batch, rank)
        metrics.update(engine.train_step(local, objective, mini_batches=shards.mini_batches,
                                         old_from_forward=fused, **entropy, **loss_term))
        if fused:
            batch.extras["old_logprobs"] = parallel.gather_rows(local.extras["old_logprobs"], shards, len(batch))
        if "old_logprobs" not in batch.extras:
            return metrics, None
        rows = list(keep_rows)
        return metrics, {"train_logprobs": batch.extras["old_logprobs"][rows].clone(),
                         "advantages": batch.extras["advantages"][rows].clone()}

    def finish_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """The step's metrics once every rank's share is added: the step term's sums into means."""
        term = self.objective.term
        return metrics if term is None else term.finish_metrics(metrics)


def _old_logprobs(engine: Any, local: TrainBatch, batch: TrainBatch, shards: RankShards,
                  entropy: dict, term: Any) -> dict[str, torch.Tensor]:
    """The no-grad pi_old forward of this rank's rows, all-gathered into ``batch.extras``."""
    old_term = {"logit_term": term.old_logit_term} if term is not None else {}
    old = {key: engine.parallel.gather_rows(value, shards, len(batch))
           for key, value in engine.compute_logprobs(local, **entropy, **old_term).items()}
    batch.extras["old_logprobs"] = old["logprobs"]
    if "routed_experts" in old:  # trainer.router_replay=old_policy (R2): replayed by train_step
        batch.extras["old_routed_experts"] = old["routed_experts"]
    return old
