"""Every logit-level KL method against an independent float64 implementation of its formula.

The references below are written from the formulas (GKD, arXiv 2306.13649; TRL's GKDTrainer) as
plainly as possible: full softmax distributions over the whole vocabulary, explicit renormalisation
for ``topk_kl``, and for
``topk_jsd`` a full-vocabulary sum with the teacher's probability set to 0 outside its
top-k (so the tail term the method adds in closed form is checked, not re-derived). Their
gradients come from autograd; the methods' own (closed-form, custom) backward must match
values and gradients to 1e-6. The token-level k1/k2/k3 used with teachers are core's and
tested there; here they are checked to be the reverse-KL estimators with the teacher as
reference.
"""

from __future__ import annotations

import pytest
import torch

from loongsage.plugin.testing import installed_registries
from loongsage_distill.kl_methods import full_jsd, full_kl, topk_jsd, topk_kl, topk_overlap

TOL = dict(atol=1e-6, rtol=1e-6)


def inputs(c=6, vocab=50, k=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    student = (torch.randn(c, vocab, generator=g, dtype=dtype) * 2).requires_grad_()
    teacher_logits = torch.randn(c, vocab, generator=g, dtype=dtype) * 2
    teacher_logprobs = torch.log_softmax(teacher_logits, -1)
    top = teacher_logprobs.topk(k, -1)
    return student, teacher_logprobs, top.values, top.indices


def ref_full_kl(z, teacher_logprobs, ids, beta):
    q = torch.exp(z) / torch.exp(z).sum(-1, keepdim=True)
    return (q * (torch.log(q) - teacher_logprobs)).sum(-1)


def ref_full_jsd(z, teacher_logprobs, ids, beta):
    q = torch.exp(z) / torch.exp(z).sum(-1, keepdim=True)
    p = torch.exp(teacher_logprobs)
    m = beta * p + (1 - beta) * q
    return beta * (p * torch.log(p / m)).sum(-1) + (1 - beta) * (q * torch.log(q / m)).sum(-1)


def ref_topk_kl(z, top_logprobs, ids, beta):
    q = torch.exp(z) / torch.exp(z).sum(-1, keepdim=True)
    q_s = q.gather(-1, ids)
    q_hat = q_s / q_s.sum(-1, keepdim=True)
    p_s = torch.exp(top_logprobs)
    p_hat = p_s / p_s.sum(-1, keepdim=True)
    return (q_hat * torch.log(q_hat / p_hat)).sum(-1)


def ref_topk_jsd(z, top_logprobs, ids, beta):
    q = torch.exp(z) / torch.exp(z).sum(-1, keepdim=True)
    p = torch.zeros_like(q).scatter(-1, ids, torch.exp(top_logprobs))  # 0 outside the top-k
    m = beta * p + (1 - beta) * q
    p_term = torch.where(p > 0, p * torch.log(torch.where(p > 0, p, 1.0) / m), torch.zeros_like(p))
    return beta * p_term.sum(-1) + (1 - beta) * (q * torch.log(q / m)).sum(-1)


CASES = [
    (full_kl, ref_full_kl, "full"),
    (full_jsd, ref_full_jsd, "full"),
    (topk_kl, ref_topk_kl, "topk"),
    (topk_jsd, ref_topk_jsd, "topk"),
]


def _call(fn, targets, student, teacher_logprobs, top_values, top_ids, beta):
    if targets == "full":
        return fn(student, teacher_logprobs, None, beta)
    return fn(student, top_values, top_ids, beta)


@pytest.mark.parametrize("beta", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("fn, ref, targets", CASES, ids=[c[0].__name__ for c in CASES])
def test_values_and_gradients_equal_the_float64_formula(fn, ref, targets, beta):
    student, teacher_logprobs, top_values, top_ids = inputs()
    weights = torch.linspace(0.5, 2.0, student.shape[0], dtype=student.dtype)  # a per-token loss weight
    got = _call(fn, targets, student, teacher_logprobs, top_values, top_ids, beta)
    (grad,) = torch.autograd.grad((got * weights).sum(), student)
    z = student.detach().clone().requires_grad_()
    want = _call(ref, targets, z, teacher_logprobs, top_values, top_ids, beta)
    (want_grad,) = torch.autograd.grad((want * weights).sum(), z)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(grad, want_grad, **TOL)
    assert (want > 0).all()  # a real divergence between different distributions, not a degenerate 0


@pytest.mark.parametrize("fn, targets", [(full_kl, "full"), (full_jsd, "full"), (topk_jsd, "topk")])
def test_the_custom_backward_passes_gradcheck(fn, targets):
    student, teacher_logprobs, top_values, top_ids = inputs(c=3, vocab=12, k=4, seed=1)
    check = lambda z: _call(fn, targets, z, teacher_logprobs, top_values, top_ids, 0.3)  # noqa: E731
    assert torch.autograd.gradcheck(check, (student,), eps=1e-6, atol=1e-7)


def test_topk_kl_renormalises_both_sides_and_ignores_logits_outside_the_top_k():
    student, _, top_values, top_ids = inputs()
    shifted = student.detach().clone()
    outside = torch.ones_like(shifted, dtype=torch.bool).scatter(-1, top_ids, False)
    shifted[outside] += 5.0  # moves the student's mass outside S, not its shape inside S
    torch.testing.assert_close(topk_kl(shifted, top_values, top_ids), topk_kl(student, top_values, top_ids), **TOL)
    same = torch.log_softmax(torch.zeros_like(student).scatter(-1, top_ids, top_values), -1)
    z = same.detach().clone().scatter(-1, top_ids, top_values)  # Q̂ = P̂ on S
    assert topk_kl(z, top_values + 3.0, top_ids).abs().max() < 1e-12  # a teacher shift renormalises away


def test_topk_jsd_tail_term_is_the_missing_student_mass():
    """With S the whole vocabulary the tail vanishes and top-k JSD is full JSD."""
    student, teacher_logprobs, _, _ = inputs(vocab=20, k=20)
    ids = torch.arange(20).expand(student.shape[0], 20)
    everything = teacher_logprobs.gather(-1, ids)
    torch.testing.assert_close(topk_jsd(student, everything, ids, 0.4), full_jsd(student, teacher_logprobs, None, 0.4),
                               **TOL)


def test_full_methods_are_zero_when_student_equals_teacher():
    student, teacher_logprobs, _, _ = inputs()
    same = teacher_logprobs.clone().requires_grad_()
    for fn in (full_kl, full_jsd):
        value = fn(same, teacher_logprobs, None, 0.5)
        (grad,) = torch.autograd.grad(value.sum(), same)
        assert value.abs().max() < 1e-12 and grad.abs().max() < 1e-12


def test_token_level_methods_are_reverse_kl_estimators_with_the_teacher_as_reference():
    g = torch.Generator().manual_seed(3)
    student, teacher = -torch.rand(4, 5, generator=g, dtype=torch.float64), -torch.rand(4, 5, generator=g,
                                                                                          dtype=torch.float64)
    d = student - teacher
    k1, k2, k3 = (installed_registries().kl_policy.get(name) for name in ("k1", "k2", "k3"))
    torch.testing.assert_close(k1(student, teacher), d, **TOL)
    torch.testing.assert_close(k2(student, teacher), 0.5 * d**2, **TOL)
    torch.testing.assert_close(k3(student, teacher), torch.exp(-d) - 1 + d, **TOL)


def test_topk_overlap_counts_shared_top_k_tokens():
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0, -1.0], [0.0, 1.0, 2.0, 3.0, 4.0]])
    teacher_ids = torch.tensor([[0, 1, 4], [0, 1, 2]])
    torch.testing.assert_close(topk_overlap(logits, teacher_ids), torch.tensor([2 / 3, 1 / 3]))
