"""Per-step metrics of what the trainer received: staleness, partial ratio, length bias.

* ``async/staleness_mean`` / ``async/staleness_max``: over every response token of the
  batch, the current weight version minus the version that sampled the token
  (``Sample.weight_versions``).
* ``rollout/partial_ratio``: fraction of the batch's samples whose tokens were sampled by
  more than one weight version (continued across an update by partial rollout, or, for a
  router trajectory, turns sampled before and after an update: its tool and template tokens
  carry the version of the turn before them, ``agentflow.store``). Router trajectories also
  report ``rollout/continued_turns_mean`` (``controller.batching.rollout_metrics``): turns
  aborted at an update and continued by the router, per sample.
* ``rollout/length_bias``: mean response length of every sample trained so far divided by
  the mean response length of every sample generated so far, trained or not (cumulative on
  both sides, so a schedule that trains everything it generates reads exactly 1.0). Below
  1.0 means the schedule favours short responses (first finishers), which is how a policy
  that starves long rollouts shows up.
  None of the peers report this (tinker-cookbook PR #822 on the bias).
"""

from __future__ import annotations

from typing import Sequence

from loongsage.data.types import Group


def batch_metrics(
    batch: Sequence[Group],
    version: int,
    *,
    trained: tuple[int, int],
    finished: tuple[int, int],
) -> dict[str, float]:
    """``trained`` and ``finished`` are cumulative (samples, response tokens) counts."""
    samples = [s for g in batch for s in g.samples]
    lags = [version - v for s in samples for v in s.weight_versions]
    overall = finished[1] / finished[0] if finished[0] else 0.0
    mean_len = trained[1] / trained[0] if trained[0] else 0.0
    return {
        "async/staleness_mean": sum(lags) / len(lags) if lags else 0.0,
        "async/staleness_max": float(max(lags)) if lags else 0.0,
        "rollout/partial_ratio": (
            sum(1 for s in samples if len(set(s.weight_versions)) > 1) / len(samples) if samples else 0.0
        ),
        "rollout/length_bias": mean_len / overall if overall else 1.0,
    }
