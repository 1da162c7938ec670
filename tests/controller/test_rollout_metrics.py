"""``rollout_metrics`` averages every numeric ``reward_info`` field over the step's samples.

Black-box agents report fields that are a number in one sample and None in another (the
exit code of a killed program, the parent segment of a root vs a fork); such a step crashed
the run with a TypeError after its rollout."""

from __future__ import annotations

from loongsage.controller.batching import rollout_metrics
from loongsage.data.types import Group, Prompt, Sample


def sample(reward: float, **info) -> Sample:
    return Sample([1, 2], [3], [-0.1], [0], [1], reward=reward, reward_info=info)


def test_a_field_that_is_none_or_missing_in_some_samples_counts_as_zero():
    group = Group(0, Prompt("s", 0, []), [sample(1.0, parent=None, exit_code=0, passed=2),
                                          sample(0.0, parent=0, exit_code=None),
                                          sample(0.0, parent=1, exit_code=1, passed=1)])
    metrics = rollout_metrics([group])
    assert metrics["rollout/parent_mean"] == 1 / 3  # (None, 0, 1)
    assert metrics["rollout/exit_code_mean"] == 1 / 3
    assert metrics["rollout/passed_mean"] == 1.0
    assert abs(metrics["rollout/reward_mean"] - 1 / 3) < 1e-6
