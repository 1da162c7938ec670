"""Dr. GRPO, RLOO, REINFORCE++ and REINFORCE++-baseline against hand-computed numbers."""

import statistics

import pytest
import torch

from loongsage.algorithms.advantages import compute_advantages
from loongsage.algorithms.validate import validate_algorithm
from loongsage.plugin.testing import installed_registries

REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.3]
GROUPS = [0, 0, 0, 0, 1, 1, 2]  # group 2 is a singleton
MASK = torch.tensor(
    [
        [1, 1, 1, 0],
        [1, 1, 0, 0],
        [1, 0, 1, 1],  # a masked token (tool output) inside the response
        [1, 1, 1, 1],
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 0],
    ],
    dtype=torch.float32,
)


def _adv(name, **params):
    return compute_advantages(REWARDS, GROUPS, MASK, validate_algorithm({"advantage_estimator": {"name": name, **params}}, installed_registries()))


def _per_sample(adv, values):
    for i, v in enumerate(values):
        torch.testing.assert_close(adv[i], MASK[i] * v)


def test_dr_grpo_is_group_mean_centring():
    _per_sample(_adv("dr_grpo"), [0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0])


def test_rloo_leave_one_out():
    # r_i minus the mean of the other three: 1 - 1/3, 0 - 2/3
    _per_sample(_adv("rloo"), [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0, 0.0])


def _whiten(values):
    mu, sd = statistics.mean(values), statistics.stdev(values)
    return [(v - mu) / (sd * sd + 1e-8) ** 0.5 for v in values]


def _tokens(per_token):
    """Flatten a per-token list-of-lists over the loss mask, in row-major order."""
    return [per_token[i][t] for i in range(7) for t in range(4) if MASK[i, t] > 0]


def _check_tokens(adv, expected_flat):
    got = [adv[i, t].item() for i in range(7) for t in range(4) if MASK[i, t] > 0]
    assert got == pytest.approx(expected_flat, abs=1e-5)
    assert torch.all(adv[MASK == 0] == 0)


def test_reinforce_pp_baseline_whitens_group_centred_rewards_over_tokens():
    centred = [0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0]
    _check_tokens(_adv("reinforce_plus_plus_baseline"), _whiten(_tokens([[c] * 4 for c in centred])))


def test_reinforce_pp_gamma_one_returns_outcome_then_whitens():
    _check_tokens(_adv("reinforce_plus_plus"), _whiten(_tokens([[r] * 4 for r in REWARDS])))


def test_reinforce_pp_discounts_over_loss_tokens_only():
    g = 0.5
    returns = []
    for i, r in enumerate(REWARDS):
        positions = [t for t in range(4) if MASK[i, t] > 0]
        row = [0.0] * 4
        for k, t in enumerate(positions):
            row[t] = r * g ** (len(positions) - 1 - k)  # the reward sits on the last loss token
        returns.append(row)
    _check_tokens(_adv("reinforce_plus_plus", gamma=g), _whiten(_tokens(returns)))


def test_reinforce_pp_uses_the_kl_penalty_per_token():
    old = torch.zeros(7, 4)
    ref = torch.full((7, 4), -1.0)  # k1 = 1 per token
    cfg = {"advantage_estimator": {"name": "reinforce_plus_plus"}, "kl": {"method": "k1", "coef": 0.1, "use_as": "reward"}}
    adv = compute_advantages(REWARDS, GROUPS, MASK, validate_algorithm(cfg, installed_registries()), old_logprobs=old, ref_logprobs=ref)
    returns = []
    for i, r in enumerate(REWARDS):
        positions = [t for t in range(4) if MASK[i, t] > 0]
        row = [0.0] * 4
        for k, t in enumerate(positions):
            row[t] = r - 0.1 * (len(positions) - k)  # outcome plus the penalties still to come
        returns.append(row)
    _check_tokens(adv, _whiten(_tokens(returns)))


@pytest.mark.parametrize("name", ["dr_grpo", "rloo", "grpo"])
def test_singleton_group_is_zero(name):
    assert torch.all(_adv(name)[6] == 0)
