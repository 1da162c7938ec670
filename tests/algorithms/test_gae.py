"""GAE (``algorithm.advantage_estimator=gae``): a hand-computed example, an independent
implementation on random batches with observation tokens inside the responses, and the
contract around it (values required, whitening, returns = Â + V)."""

from __future__ import annotations

import pytest
import torch

from loongsage.algorithms.advantages import advantage_inputs, compute_advantages
from loongsage.algorithms.gae import gae, gae_returns
from loongsage.algorithms.validate import validate_algorithm
from loongsage.plugins import get_registries


def _spec(**params):
    return validate_algorithm({"advantage_estimator": {"name": "gae", **params}}, get_registries())


def test_hand_computed_example_skips_the_observation_token():
    # positions: 0 prompt | 1 action | 2 action | 3 observation (tool output) | 4 action | 5 pad
    mask = torch.tensor([[0, 1, 1, 0, 1, 0]], dtype=torch.float32)
    values = torch.tensor([[9.0, 0.5, 0.25, 7.0, 0.75, 3.0]])  # 9, 7, 3 must not matter
    rewards = torch.zeros(1, 6)
    rewards[0, 4] = 1.0  # outcome on the last loss token
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # δ4 = 1 − 0.75 = 0.25                        Â4 = 0.25
    # δ2 = 0 + 0.9·0.75 − 0.25 = 0.425            Â2 = 0.425 + 0.72·0.25 = 0.605
    # δ1 = 0 + 0.9·0.25 − 0.5 = −0.275            Â1 = −0.275 + 0.72·0.605 = 0.1606
    expected = torch.tensor([[0.0, 0.1606, 0.605, 0.0, 0.25, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-6)
    assert torch.allclose(ret, (expected + values) * mask, atol=1e-6)


def _reference_gae(rewards, values, mask, gamma, lam):
    """Independent: per row, the loss tokens as one list and Â_k = Σ_l (γλ)^l δ_{k+l}."""
    adv = torch.zeros_like(values, dtype=torch.float64)
    for row in range(mask.shape[0]):
        steps = [t for t in range(mask.shape[1]) if mask[row, t] > 0]
        v = [float(values[row, t]) for t in steps] + [0.0]
        r = [float(rewards[row, t]) for t in steps]
        deltas = [r[k] + gamma * v[k + 1] - v[k] for k in range(len(steps))]
        for k, t in enumerate(steps):
            adv[row, t] = sum((gamma * lam) ** l * deltas[k + l] for l in range(len(steps) - k))
    return adv


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.7, 0.5)])
def test_equals_an_independent_implementation_with_observation_tokens(gamma, lam):
    gen = torch.Generator().manual_seed(7)
    n, length = 6, 40
    mask = torch.zeros(n, length)
    for row in range(n):
        start = int(torch.randint(2, 8, (1,), generator=gen))
        end = int(torch.randint(start + 5, length, (1,), generator=gen))
        mask[row, start:end] = 1.0
        gap = int(torch.randint(start + 1, end - 2, (1,), generator=gen))
        mask[row, gap:gap + 2] = 0.0  # an observation inside the response: not actions
    values = torch.randn(n, length, generator=gen)
    rewards = torch.randn(n, length, generator=gen) * 0.1 * mask  # per-token penalties...
    rewards[:, -1] = 0.0
    for row in range(n):  # ...plus an outcome on each row's last loss token
        rewards[row, int(mask[row].nonzero().max())] += float(torch.rand(1, generator=gen))
    adv, ret = gae(rewards, values, mask, gamma, lam)
    expected = _reference_gae(rewards, values, mask, gamma, lam)
    assert torch.allclose(adv.double(), expected, atol=1e-5)
    assert torch.allclose(ret, (adv + values) * mask, atol=1e-6)
    assert (adv[mask == 0] == 0).all()


def test_estimator_whitens_and_returns_are_unwhitened():
    mask = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.float32)
    values = torch.tensor([[0.0, 0.2, 0.4, 0.6], [0.0, 0.0, -0.3, 0.1]])
    rewards = [1.0, 0.0]
    raw, ret = gae(advantage_inputs(rewards, [0, 1], mask, _spec(), values=values).token_rewards,
                   values, mask, 1.0, 1.0)
    whitened = compute_advantages(rewards, [0, 1], mask, _spec(), values=values)
    picked = raw[mask > 0]
    assert torch.allclose(whitened[mask > 0], (picked - picked.mean()) / (picked.var() + 1e-8).sqrt(), atol=1e-5)
    plain = compute_advantages(rewards, [0, 1], mask, _spec(whiten=False), values=values)
    assert torch.allclose(plain, raw)
    inputs = advantage_inputs(rewards, [0, 1], mask, _spec(), values=values)
    assert torch.allclose(gae_returns(inputs, _spec().advantage.params), ret)
    assert torch.allclose(ret[0, 1:], torch.ones(3))  # γ = λ = 1: every return is the outcome


def test_values_are_required():
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match="needs per-token values"):
        compute_advantages([1.0, 0.0], [0, 1], mask, _spec())


@pytest.mark.parametrize("key,value", [("gamma", 0.0), ("lam", 1.5)])
def test_bad_parameters_name_the_key(key, value):
    from loongsage.errors import ConfigError

    with pytest.raises((ConfigError, ValueError), match=key):
        _spec(**{key: value})
