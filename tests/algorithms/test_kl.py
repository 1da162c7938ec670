"""KL policies: values against Schulman's formulas, gradients against closed-form KLs.

The gradient checks take the exact expectation over a small vocabulary: for a per-token
estimator k(a), E_{a~π_θ}[∇k(a)] = Σ_a sg(π_θ(a))·∇k(a), compared with autograd of the
closed-form KL of two categoricals (computed without the code under test).
"""

import math

import pytest
import torch

from loongsage.algorithms import kl


def _policies():
    torch.manual_seed(0)
    logits = torch.randn(7, dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.randn(7, dtype=torch.float64), -1)
    return logits, ref


def _expected_grad(estimator):
    logits, ref = _policies()
    logp = torch.log_softmax(logits, -1)
    probs = logp.exp().detach()
    (probs * estimator(logp, ref)).sum().backward()
    return logits.grad


def _closed_form_grad(which):
    logits, ref = _policies()
    logp = torch.log_softmax(logits, -1)
    if which == "reverse":  # KL(π_θ‖π_ref)
        value = (logp.exp() * (logp - ref)).sum()
    else:  # KL(π_ref‖π_θ)
        value = (ref.exp() * (ref - logp)).sum()
    value.backward()
    return logits.grad


def test_values_match_formulas():
    lp = torch.tensor([-1.0, -0.5, -2.0])
    ref = torch.tensor([-1.2, -0.5, -1.0])
    for i in range(3):
        d = lp[i].item() - ref[i].item()
        r = math.exp(-d)
        assert kl.k1(lp, ref)[i].item() == pytest.approx(d)
        assert kl.k2(lp, ref)[i].item() == pytest.approx(0.5 * d * d)
        assert kl.k3(lp, ref)[i].item() == pytest.approx(r - 1 - math.log(r))
        assert kl.k1_st(lp, ref)[i].item() == pytest.approx(d)
        assert kl.k3_st(lp, ref)[i].item() == pytest.approx(r - 1 - math.log(r))


def test_low_var_kl_clamps_outliers():
    lp = torch.tensor([0.0, -30.0, -1.0, 0.0])
    ref = torch.tensor([-30.0, 0.0, -1.5, -6.0])
    out = kl.low_var_kl(lp, ref)
    d = -1.0 + 1.5
    assert out[0].item() == pytest.approx(10.0)  # k3 = e^-30 - 1 + 30 > 10: clamped
    assert out[1].item() == pytest.approx(10.0)  # k3 = e^30 - 1 - 30: clamped
    assert out[2].item() == pytest.approx(math.exp(-d) - 1 + d)
    assert out[3].item() == pytest.approx(math.exp(-6) - 1 + 6, rel=1e-5)  # below the clamp


def test_k2_gradient_is_the_reverse_kl_gradient():
    torch.testing.assert_close(_expected_grad(kl.k2), _closed_form_grad("reverse"))


def test_k3_gradient_is_the_forward_kl_gradient():
    torch.testing.assert_close(_expected_grad(kl.k3), _closed_form_grad("forward"))
    assert not torch.allclose(_expected_grad(kl.k3), _closed_form_grad("reverse"))


def test_k1_has_zero_expected_gradient():
    torch.testing.assert_close(_expected_grad(kl.k1), torch.zeros(7, dtype=torch.float64))


@pytest.mark.parametrize("st", [kl.k1_st, kl.k3_st])
def test_straight_through_variants_carry_the_k2_gradient(st):
    torch.testing.assert_close(_expected_grad(st), _closed_form_grad("reverse"))


def test_k3_is_unbiased_for_the_reverse_kl_value():
    logits, ref = _policies()
    logp = torch.log_softmax(logits, -1).detach()
    exact = (logp.exp() * (logp - ref)).sum()
    for estimator in (kl.k1, kl.k3):
        assert (logp.exp() * estimator(logp, ref)).sum().item() == pytest.approx(exact.item())
