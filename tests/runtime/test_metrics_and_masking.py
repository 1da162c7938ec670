"""Per-step metrics and off-policy masking, on hand-built groups with known answers."""

from __future__ import annotations

import pytest

from loongsage.data.types import Group, Prompt, Sample
from loongsage.runtime.metrics import batch_metrics
from loongsage.runtime.partial import mask_offpolicy_tokens


def sample(versions: list[int], mask: list[int] | None = None) -> Sample:
    n = len(versions)
    return Sample([1], list(range(n)), [-0.5] * n, versions, mask or [1] * n)


def group(*samples: Sample) -> Group:
    return Group(0, Prompt("a", 0, []), list(samples))


def test_batch_metrics_numbers() -> None:
    batch = [group(sample([3, 3, 4, 4]), sample([4, 4]))]  # trained at version 5
    m = batch_metrics(batch, version=5, trained=(2, 6), finished=(4, 24))
    assert m["async/staleness_mean"] == pytest.approx((2 + 2 + 1 + 1 + 1 + 1) / 6)
    assert m["async/staleness_max"] == 2.0
    assert m["rollout/partial_ratio"] == 0.5  # one of two samples spans two versions
    assert m["rollout/length_bias"] == pytest.approx(3.0 / 6.0)  # trained mean 3 vs all 6
    assert batch_metrics(batch, 5, trained=(4, 24), finished=(4, 24))["rollout/length_bias"] == 1.0


def test_masking_drops_only_the_prefix_of_continued_samples() -> None:
    g = group(sample([1, 1, 2, 2], mask=[1, 0, 1, 1]), sample([2, 2]))
    assert mask_offpolicy_tokens([g]) == 1  # the tool token (mask 0) was already out
    assert g.samples[0].loss_mask == [0, 0, 1, 1]
    assert g.samples[1].loss_mask == [1, 1]
