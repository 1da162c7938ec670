"""Functions shipped into the train-engine actors, so tensors never leave their processes."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from loongsage.algorithms.advantages import compute_advantages
from loongsage.algorithms.objective import Objective
from loongsage.engines.batch import TrainBatch
from loongsage.engines.distributed import RankShards


def train_on_rollout(
    engine: Any,
    data: tuple[TrainBatch, torch.Tensor, torch.Tensor],
    shards: RankShards,
    objective: Objective,
    keep_rows: Sequence[int] = (),
) -> tuple[dict[str, float], torch.Tensor]:
    """pi_old (and reference) logprobs at step start, advantages, then the optimizer steps.

    ``data`` is the step's whole batch (with per-sample rewards and group index); this rank
    computes the logprobs of its own rows (``shards``) and all-gathers them, so advantages
    and ``objective.prepare`` see the whole batch on every rank, then trains its rows.
    Advantages are computed after the logprobs because a KL penalty used as a reward
    (``algorithm.kl.use_as=reward``) needs pi_old and pi_ref first. Returns the step's
    metrics (this rank's share) and the pi_old logprobs of the batch rows ``keep_rows`` (the
    samples the run directory saves), so only those cross back from the actor.
    """
    batch, rewards, group_index = data
    parallel, rank = engine.parallel, engine.parallel.rank
    local = shards.local_batch(batch, rank)
    old = engine.compute_logprobs(local)["logprobs"]
    batch.extras["old_logprobs"] = parallel.gather_rows(old, shards, len(batch))
    if objective.needs_reference:
        ref = engine.compute_ref_logprobs(local)
        batch.extras["ref_logprobs"] = parallel.gather_rows(ref, shards, len(batch))
    batch.extras["advantages"] = compute_advantages(
        rewards,
        group_index,
        batch.loss_mask,
        objective.spec,
        old_logprobs=batch.extras["old_logprobs"],
        ref_logprobs=batch.extras.get("ref_logprobs"),
    )
    objective.prepare(batch)  # batch-level statistics (M2PO's mask) before any split
    kept = batch.extras["old_logprobs"][list(keep_rows)].clone()
    metrics = engine.train_step(shards.local_batch(batch, rank), objective, mini_batches=shards.mini_batches)
    return metrics, kept
