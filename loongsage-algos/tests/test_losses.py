"""GSPO, GSPO-token, CISPO, REINFORCE and M2PO: values and gradients from their formulas."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loongsage.algorithms.objective import Objective
from loongsage.plugin.testing import check_policy_loss_contract, loss_context
from loongsage.plugin import PolicyLossInputs
from loongsage.plugin.testing import installed_registries
from loongsage_algos.losses.cispo import cispo_loss
from loongsage_algos.losses.gspo import gspo_loss, gspo_token_loss
from loongsage_algos.losses.m2po import m2po_keep_mask, m2po_loss
from loongsage_algos.losses.reinforce import reinforce_loss
from loongsage_algos.params import CISPOParams, GSPOParams, GSPOTokenParams, M2POParams, ReinforceParams

D = torch.float64


def _inputs(log_ratio, adv, mask=None, roll_shift=None):
    log_ratio = torch.tensor(log_ratio, dtype=D)
    old = torch.full_like(log_ratio, -1.0)
    logprobs = (old + log_ratio).requires_grad_()
    roll = old.clone() if roll_shift is None else old - torch.tensor(roll_shift, dtype=D)
    adv = torch.tensor(adv, dtype=D)
    mask = torch.ones_like(adv) if mask is None else torch.tensor(mask, dtype=D)
    return PolicyLossInputs(logprobs, old, roll, adv, mask)


# ---- GSPO -------------------------------------------------------------------------------

def test_gspo_sequence_ratio_and_clip_by_hand():
    # row 0: log ρ = [0.1, 0.3, (masked 5.0)] -> s = e^0.2 > 1.1: clipped for Â > 0
    # row 1: log ρ = [0.02, -0.04, 0.05]      -> s = e^{0.01}: inside, Â < 0
    inp = _inputs([[0.1, 0.3, 5.0], [0.02, -0.04, 0.05]], [[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]],
                  mask=[[1, 1, 0], [1, 1, 1]])
    out = gspo_loss(inp, GSPOParams(eps_low=0.1, eps_high=0.1))
    assert out.loss[0, 0].item() == pytest.approx(-1.1 * 2.0)
    assert out.loss[1, 2].item() == pytest.approx(math.exp(0.01) * 1.0)
    assert out.metrics["train/gspo_clipfrac"].tolist() == [1.0, 0.0]
    out.loss[1, 0].backward()  # the row's loss, d/dlog π_t = −Â·s/|y|
    expected = math.exp(0.01) * 1.0 / 3
    assert inp.logprobs.grad[1].tolist() == pytest.approx([expected] * 3)
    assert inp.logprobs.grad[0].abs().sum().item() == 0.0


def _random_batch(seed, n=4, length=6):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(n, length, generator=g) > 0.3).double()
    mask[:, 0] = 1.0
    old = -torch.rand(n, length, generator=g, dtype=D) * 2
    extras = {
        "old_logprobs": old,
        "rollout_logprobs": old + 0.05 * torch.randn(n, length, generator=g, dtype=D),
        "advantages": torch.randn(n, 1, generator=g, dtype=D).expand(n, length) * mask,
    }
    return old + 0.01 * torch.randn(n, length, generator=g, dtype=D), mask, extras


def _loss_and_grad(policy_loss, logprobs, mask, extras, mode="seq_mean_token_mean"):
    leaf = logprobs.clone().requires_grad_()
    obj = Objective.from_config({"policy_loss": policy_loss, "loss_agg_mode": mode}, installed_registries())
    loss, metrics = obj(loss_context(leaf, mask, extras))
    loss.backward()
    return loss.item(), leaf.grad, metrics


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_gspo_token_equals_gspo_with_sequence_advantages(seed):
    logprobs, mask, extras = _random_batch(seed)
    a, grad_a, _ = _loss_and_grad({"name": "gspo"}, logprobs, mask, extras)
    b, grad_b, _ = _loss_and_grad({"name": "gspo_token"}, logprobs, mask, extras)
    assert a == pytest.approx(b, rel=1e-12, abs=1e-15)
    torch.testing.assert_close(grad_a, grad_b)


def test_gspo_token_value_per_token_is_the_sequence_ratio():
    inp = _inputs([[0.1, 0.3], [0.0, -0.2]], [[1.0, 3.0], [-1.0, 2.0]])
    out = gspo_token_loss(inp, GSPOTokenParams(eps_low=1.0, eps_high=10.0))
    s0, s1 = math.exp(0.2), math.exp(-0.1)
    assert out.loss.flatten().tolist() == pytest.approx([-s0, -3 * s0, s1, -2 * s1])


# ---- CISPO ------------------------------------------------------------------------------

def test_cispo_keeps_the_gradient_of_clipped_tokens():
    # ρ = e^0.5 = 1.65 > 1.28: the weight is capped at 1.28 but the token still gets gradient
    inp = _inputs([[0.5, 0.1, -0.5]], [[1.0, 1.0, -1.0]])
    out = cispo_loss(inp, CISPOParams(eps_low=0.2, eps_high=0.28))
    out.loss.sum().backward()
    w = [1.28, math.exp(0.1), 0.8]
    adv = [1.0, 1.0, -1.0]
    assert inp.logprobs.grad[0].tolist() == pytest.approx([-w[j] * adv[j] for j in range(3)])
    lp = [-0.5, -0.9, -1.5]
    assert out.loss[0].tolist() == pytest.approx([-w[j] * adv[j] * lp[j] for j in range(3)])
    assert out.metrics["train/cispo_clipfrac"][0].tolist() == [1.0, 0.0, 1.0]


def test_ppo_clip_would_block_the_same_token():
    inp = _inputs([[0.5]], [[1.0]])
    obj = Objective.from_config({"policy_loss": "ppo_clip"}, installed_registries())
    extras = {"old_logprobs": inp.old_logprobs, "rollout_logprobs": inp.rollout_logprobs, "advantages": inp.advantages}
    obj(loss_context(inp.logprobs, inp.mask, extras))[0].backward()
    assert inp.logprobs.grad.item() == 0.0


# ---- REINFORCE --------------------------------------------------------------------------

def test_reinforce_is_unclipped_ratio_times_advantage():
    inp = _inputs([[2.0, -1.0]], [[1.0, -2.0]])
    out = reinforce_loss(inp, ReinforceParams())
    out.loss.sum().backward()
    r = [math.exp(2.0), math.exp(-1.0)]
    assert out.loss[0].tolist() == pytest.approx([-r[0], 2 * r[1]])
    assert inp.logprobs.grad[0].tolist() == pytest.approx([-r[0], 2 * r[1]])


# ---- M2PO -------------------------------------------------------------------------------

def test_m2po_masks_the_largest_until_the_threshold_holds():
    # Δ = log π_old − log π_roll = [0.5, 0.1, −0.2, 0.05] -> (Δ)² = [0.25, 0.01, 0.04, 0.0025]
    # all four: mean 0.0756 > 0.04; without 0.25: 0.0525/3 = 0.0175 <= 0.04
    inp = _inputs([[0.0, 0.0, 0.0, 0.0]], [[1.0, 1.0, -1.0, 1.0]], roll_shift=[[0.5, 0.1, -0.2, 0.05]])
    out = m2po_loss(inp, M2POParams(threshold=0.04))
    assert out.keep[0].tolist() == [0.0, 1.0, 1.0, 1.0]
    # ratio π_θ/π_roll = e^Δ since π_θ = π_old here
    assert out.loss[0].tolist() == pytest.approx([-math.exp(0.5), -math.exp(0.1), math.exp(-0.2), -math.exp(0.05)])


def test_m2po_fallback_keeps_only_the_smallest_token():
    sq = torch.tensor([[0.49, 0.25, 0.36]], dtype=D)
    keep, fallback = m2po_keep_mask(sq, torch.ones_like(sq), 0.04)
    assert fallback and keep[0].tolist() == [0.0, 1.0, 0.0]


def test_m2po_ignores_masked_tokens():
    sq = torch.tensor([[9.0, 0.01, 0.02]], dtype=D)
    keep, fallback = m2po_keep_mask(sq, torch.tensor([[0.0, 1.0, 1.0]], dtype=D), 0.04)
    assert not fallback and keep[0].tolist() == [0.0, 1.0, 1.0]


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=30),
    threshold=st.floats(0.001, 0.5),
)
def test_m2po_kept_second_moment_is_within_threshold_and_minimal(values, threshold):
    sq = torch.tensor([values], dtype=D)
    keep, fallback = m2po_keep_mask(sq, torch.ones_like(sq), threshold)
    kept = [v for v, k in zip(values, keep[0].tolist()) if k]
    dropped = [v for v, k in zip(values, keep[0].tolist()) if not k]
    if fallback:
        assert kept == [min(values)]
        assert min(values) > threshold
    else:
        assert sum(kept) / len(kept) <= threshold + 1e-12
        assert not dropped or min(dropped) >= max(kept)  # only the largest are masked
        if dropped:  # minimal: keeping one more (the smallest dropped) breaks the bound
            assert (sum(kept) + min(dropped)) / (len(kept) + 1) > threshold


def test_m2po_denominator_counts_masked_tokens():
    inp = _inputs([[0.0, 0.0, 0.0, 0.0]], [[1.0, 1.0, 1.0, 1.0]], roll_shift=[[0.5, 0.0, 0.0, 0.0]])
    extras = {"old_logprobs": inp.old_logprobs, "rollout_logprobs": inp.rollout_logprobs, "advantages": inp.advantages}
    obj = Objective.from_config({"policy_loss": "m2po"}, installed_registries())
    loss, metrics = obj(loss_context(inp.logprobs, inp.mask, extras))
    assert loss.item() == pytest.approx(-3 / 4)  # three kept tokens with ratio 1, divided by all 4
    assert metrics["train/m2po_masked_frac"] == pytest.approx(1 / 4)
    assert metrics["train/m2po_fallback"] == 0.0


@pytest.mark.parametrize(
    "fn,params",
    [(gspo_loss, GSPOParams()), (gspo_token_loss, GSPOTokenParams()), (cispo_loss, CISPOParams()),
     (reinforce_loss, ReinforceParams()), (m2po_loss, M2POParams())],
)
def test_contract(fn, params):
    check_policy_loss_contract(fn, params)
