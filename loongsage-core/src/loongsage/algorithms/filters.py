"""Data filters: the contract, a chain built from config, and batch filling with a cap.

Contract of a ``data_filter`` plugin::

    fn(groups: list[Group], params) -> FilterResult

A filter receives the finished prompt groups of one collection round and returns the
groups to train on. It may drop whole groups (``dynamic_sampling``), drop samples, or
return *modified copies* of groups and samples (``overlong`` zeroes the loss mask of
truncated samples; reward shaping adds a length penalty); it never mutates its input.
``FilterResult.metrics`` are counts for this call (``rollout/filter_drop``...); the chain
sums them. Filters run after rewards are known and before advantages are computed.

``fill_batch`` keeps drawing groups (the caller's ``draw(n)`` runs rollouts) and filtering
them until ``target`` groups pass or ``max_rounds`` draws were made (DAPO dynamic sampling;
verl ``max_num_gen_batches``). It reports ``rollout/filter_groups_drawn`` (how many groups
were generated), ``rollout/filter_groups_kept``, ``rollout/filter_rounds`` and
``rollout/filter_batch_short`` (target minus what was found; 0 when the batch is full).
Surplus passing groups are returned separately so the caller can carry them over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from loongsage.data.types import Group
from loongsage.deadline.budget import UNLIMITED, Budget


@dataclass
class FilterResult:
    """Groups that passed (possibly modified copies) and this call's counters."""

    groups: list[Group]
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class FillResult:
    """What ``fill_batch`` returns: the batch, surplus groups to carry over, counters."""

    groups: list[Group]
    surplus: list[Group]
    metrics: dict[str, float]


class FilterChain:
    """Filters (resolved ``data_filter`` ``PluginRef``s) applied in order; metrics summed.

    Each filter call runs within ``budget`` (``budgets.filter_s`` in a run): one that overruns
    it raises ``BudgetExceeded`` naming the filter and its config key instead of stalling the step.
    """

    def __init__(self, components: Sequence[Any] = (), budget: Budget = UNLIMITED):
        self.components = tuple(components)
        self.budget = budget

    @property
    def max_rounds(self) -> int:
        """The largest ``max_rounds`` any filter asks for (1 when none resamples)."""
        return max([int(getattr(c.params, "max_rounds", 1) or 1) for c in self.components] + [1])

    def __call__(self, groups: list[Group]) -> FilterResult:
        metrics: dict[str, float] = {}
        for comp in self.components:
            what = f"{comp.key}: data filter '{comp.name}'"
            result = self.budget.run(what, comp.obj, list(groups), comp.params)
            groups = result.groups
            for name, value in result.metrics.items():
                metrics[name] = metrics.get(name, 0.0) + float(value)
        return FilterResult(list(groups), metrics)


def fill_batch(
    draw: Callable[[int], list[Group]],
    chain: Callable[[list[Group]], FilterResult],
    target: int,
    max_rounds: int,
) -> FillResult:
    """Draw and filter until ``target`` groups pass or ``max_rounds`` draws were made."""
    if target < 1 or max_rounds < 1:
        raise ValueError(f"fill_batch: target ({target}) and max_rounds ({max_rounds}) must be >= 1")
    kept: list[Group] = []
    metrics: dict[str, float] = {}
    drawn = rounds = 0
    while len(kept) < target and rounds < max_rounds:
        batch = draw(target - len(kept))
        rounds += 1
        drawn += len(batch)
        result = chain(batch)
        kept.extend(result.groups)
        for name, value in result.metrics.items():
            metrics[name] = metrics.get(name, 0.0) + float(value)
    metrics.update({
        "rollout/filter_groups_drawn": float(drawn),
        "rollout/filter_groups_kept": float(min(len(kept), target)),
        "rollout/filter_rounds": float(rounds),
        "rollout/filter_batch_short": float(max(target - len(kept), 0)),
    })
    return FillResult(kept[:target], kept[target:], metrics)
