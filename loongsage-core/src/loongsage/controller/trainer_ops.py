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
    keep_logprobs: int = 0,
) -> tuple[dict[str, float], torch.Tensor]:
    """pi_old (and reference) logprobs at step start, advantages, then the optimizer steps.

    Advantages are computed here, after the logprobs, because a KL penalty used as a
    reward (``algorithm.kl.use_as=reward``) needs pi_old and pi_ref first. Returns the step's
    metrics and the pi_old logprobs of the first ``keep_logprobs`` rows (the samples the run
    directory saves), so only those cross back from the actor.
    """
    batch.extras["old_logprobs"] = engine.compute_logprobs(batch)["logprobs"]
    if objective.needs_reference:
        batch.extras["ref_logprobs"] = engine.compute_ref_logprobs(batch)
    batch.extras["advantages"] = compute_advantages(
        rewards,
        group_index,
        batch.loss_mask,
        objective.spec,
        old_logprobs=batch.extras["old_logprobs"],
        ref_logprobs=batch.extras.get("ref_logprobs"),
    )
    objective.prepare(batch)  # batch-level statistics (M2PO's mask) before any split
    kept = batch.extras["old_logprobs"][:keep_logprobs].clone()
    return engine.train_step(batch, objective, mini_batches=mini_batches), kept
