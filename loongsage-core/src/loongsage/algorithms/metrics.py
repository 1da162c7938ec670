"""Combining the metrics a loss closure returns for each micro-batch.

Every metric the objective returns is this micro-batch's additive share of the mini-batch
value (already divided by the global token or sequence count), exactly like the loss. A
train engine therefore *sums* the dicts over micro-batches and data-parallel ranks; taking
their mean would divide by the number of micro-batches a second time.
"""

from __future__ import annotations

from typing import Iterable, Mapping


def sum_metrics(per_micro_batch: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Sum metric dicts key by key (a key missing from a micro-batch counts as 0)."""
    total: dict[str, float] = {}
    for metrics in per_micro_batch:
        for key, value in metrics.items():
            total[key] = total.get(key, 0.0) + float(value)
    return total
