"""GRPO advantage modes and ``compute_advantages``, against hand-computed numbers."""

import math
import statistics

import pytest
import torch

from loongsage.algorithms.advantages import compute_advantages
from loongsage.algorithms.validate import validate_algorithm
from loongsage.plugins import get_registries

REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 0.5]
GROUPS = [7, 7, 7, 3, 3, 9]  # group 9 is a singleton
MASK = torch.tensor([[0, 1, 1, 0]] * 6, dtype=torch.float32)


def _adv(norm_mode, **kw):
    cfg = {"advantage_estimator": {"name": "grpo", "norm_mode": norm_mode, **kw}}
    return compute_advantages(REWARDS, GROUPS, MASK, validate_algorithm(cfg, get_registries()))


def _expected_group_zscore():
    out = []
    for r, g in zip(REWARDS, GROUPS):
        members = [x for x, h in zip(REWARDS, GROUPS) if h == g]
        if len(members) == 1:
            out.append(0.0)
            continue
        mu, sd = statistics.mean(members), statistics.stdev(members)
        out.append((r - mu) / (sd + 1e-6))
    return out


def _check(adv, per_sample):
    assert adv.shape == MASK.shape
    for i, value in enumerate(per_sample):
        assert adv[i, 1].item() == pytest.approx(value, abs=1e-6)
        assert adv[i, 2].item() == pytest.approx(value, abs=1e-6)
        assert adv[i, 0].item() == 0.0 and adv[i, 3].item() == 0.0


def test_group_zscore():
    # group 7: mean 1/3, stdev sqrt(1/3); group 3: all equal -> 0; singleton -> 0
    expected = _expected_group_zscore()
    assert expected[0] == pytest.approx((2 / 3) / (math.sqrt(1 / 3) + 1e-6))
    _check(_adv("group_zscore"), expected)


def test_group_mean():
    _check(_adv("group_mean"), [2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0])


def test_batch_modes():
    mu = sum(REWARDS) / 6
    sd = statistics.stdev(REWARDS)
    _check(_adv("batch_mean"), [r - mu for r in REWARDS])
    _check(_adv("batch_zscore"), [(r - mu) / (sd + 1e-6) for r in REWARDS])


def test_none_and_population_std():
    _check(_adv("none"), REWARDS)
    pop = statistics.pstdev([1.0, 0.0, 0.0])
    adv = _adv("group_zscore", std_unbiased=False)
    assert adv[0, 1].item() == pytest.approx((2 / 3) / (pop + 1e-6), abs=1e-6)


def test_singleton_group_gets_zero():
    for mode in ("group_zscore", "group_mean"):
        assert torch.all(_adv(mode)[5] == 0)


def test_kl_as_reward_penalty_is_subtracted_per_token():
    old = torch.full((6, 4), -1.0)
    ref = torch.full((6, 4), -1.5)
    cfg = {"advantage_estimator": {"name": "grpo", "norm_mode": "none"},
           "kl": {"method": "k1", "coef": 0.1, "use_as": "reward"}}
    adv = compute_advantages(REWARDS, GROUPS, MASK, validate_algorithm(cfg, get_registries()), old_logprobs=old, ref_logprobs=ref)
    # two loss tokens, each k1 = 0.5, beta = 0.1 -> outcome reward minus 0.1
    _check(adv, [r - 0.1 for r in REWARDS])
    with pytest.raises(ValueError, match="ref_logprobs"):
        compute_advantages(REWARDS, GROUPS, MASK, validate_algorithm(cfg, get_registries()))


def test_shape_mismatch_is_reported():
    with pytest.raises(ValueError, match="N = 6"):
        compute_advantages(REWARDS[:5], GROUPS[:5], MASK, validate_algorithm({}, get_registries()))
