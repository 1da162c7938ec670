"""PPO-clip with clip-higher and dual-clip: values and gradients checked token by token."""

import math

import pytest
import torch

from loongsage.algorithms.params import PPOClipParams
from loongsage.algorithms.policy_loss import ppo_clip_loss
from loongsage.plugin.testing import check_policy_loss_contract
from loongsage.algorithms.types import PolicyLossInputs

# (log ρ, Â) -> expected loss under eps_low 0.2, eps_high 0.28, c = 3, and whether the
# gradient flows (d loss / d log π_θ = −ρÂ when the unclipped term is active)
CASES = [
    (0.1, 1.0, -math.exp(0.1), True),  # inside the trust region
    (0.4, 1.0, -1.28, False),  # above 1 + eps_high with Â > 0: clipped
    (-0.4, 1.0, -math.exp(-0.4), True),  # below 1 - eps_low with Â > 0: pessimistic min keeps ρÂ
    (-0.4, -1.0, 0.8, False),  # below 1 - eps_low with Â < 0: clipped
    (2.0, -1.0, 3.0, False),  # ρ = 7.39 on a bad token: dual-clip caps the loss at c·|Â|
    (0.25, -1.0, math.exp(0.25), True),  # ρ = 1.284 > 1.28 but Â < 0: unclipped is larger
]


def _inputs():
    log_ratio = torch.tensor([[c[0] for c in CASES]], dtype=torch.float64)
    old = torch.full_like(log_ratio, -1.0)
    logprobs = (old + log_ratio).requires_grad_()
    adv = torch.tensor([[c[1] for c in CASES]], dtype=torch.float64)
    return PolicyLossInputs(logprobs, old, old.clone(), adv, torch.ones_like(adv))


def test_values_and_gradients_by_hand():
    inputs = _inputs()
    out = ppo_clip_loss(inputs, PPOClipParams(eps_low=0.2, eps_high=0.28, dual_clip=3.0))
    out.loss.sum().backward()
    for j, (lr, adv, expected, flows) in enumerate(CASES):
        assert out.loss[0, j].item() == pytest.approx(expected, rel=1e-9)
        grad = -math.exp(lr) * adv if flows else 0.0
        assert inputs.logprobs.grad[0, j].item() == pytest.approx(grad, rel=1e-9, abs=1e-12)
    assert out.metrics["train/pg_clipfrac"][0].tolist() == [0, 1, 0, 1, 0, 0]  # dual-clip counted apart
    assert out.metrics["train/pg_clipfrac_lower"][0].tolist() == [0, 0, 0, 0, 1, 0]


def test_without_dual_clip_the_bad_token_is_unbounded():
    out = ppo_clip_loss(_inputs(), PPOClipParams(dual_clip=None))
    assert out.loss[0, 4].item() == pytest.approx(math.exp(2.0))


def test_symmetric_clip_is_classic_ppo():
    out = ppo_clip_loss(_inputs(), PPOClipParams(eps_low=0.2, eps_high=0.2, dual_clip=None))
    assert out.loss[0, 1].item() == pytest.approx(-1.2)
    assert out.loss[0, 5].item() == pytest.approx(math.exp(0.25))


def test_params_reject_nonsense():
    with pytest.raises(ValueError, match="dual_clip"):
        PPOClipParams(dual_clip=1.0)
    with pytest.raises(ValueError, match="eps_low"):
        PPOClipParams(eps_low=1.5)


def test_contract():
    check_policy_loss_contract(ppo_clip_loss, PPOClipParams())
