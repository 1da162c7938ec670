"""Functions shipped into the train-engine actor, so tensors never leave its process."""

from __future__ import annotations

from typing import Any

import torch

from loongsage.algorithms.advantages import compute_advantages
from loongsage.algorithms.objective import Objective
from loongsage.engines.batch import TrainBatch


def train_on_rollout(
    engine: Any,
    batch: TrainBatch,
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    objective: Objective,
    mini_batches: int,
) -> dict[str, float]:
    """pi_old (and reference) logprobs at step start, advantages, then the optimizer steps.

    Advantages are computed here, after the logprobs, because a KL penalty used as a
    reward (``algorithm.kl.use_as=reward``) needs pi_old and pi_ref first, and a
    distillation penalty (``objective.distill``, ``loongsage.algorithms.distill_term``)
    needs the pi_old forward's values. Without an RL loss (``objective.rl_weight == 0``,
    ``opd.gkd_ratio=1``) none of this runs: the optimizer steps on the distillation loss.
    """
    distill = objective.distill
    entropy = {"with_entropy": distill.needs_entropy} if distill is not None else {}
    metrics: dict[str, float] = {}
    if objective.rl_weight > 0:
        pg_term = {"logit_term": distill.pg_logit_term} if distill is not None else {}
        old = engine.compute_logprobs(batch, **entropy, **pg_term)
        batch.extras["old_logprobs"] = old["logprobs"]
        if objective.needs_reference:
            batch.extras["ref_logprobs"] = engine.compute_ref_logprobs(batch)
        advantages = compute_advantages(
            rewards,
            group_index,
            batch.loss_mask,
            objective.spec,
            old_logprobs=batch.extras["old_logprobs"],
            ref_logprobs=batch.extras.get("ref_logprobs"),
        )
        if distill is not None:
            advantages, metrics = distill.shape_advantages(batch, advantages, old)
        batch.extras["advantages"] = advantages
        objective.prepare(batch)  # batch-level statistics (M2PO's mask) before any split
    loss_term = {"logit_term": distill.logit_term} if distill is not None else {}
    metrics.update(engine.train_step(batch, objective, mini_batches=mini_batches, **entropy, **loss_term))
    return distill.finish_metrics(metrics) if distill is not None else metrics
