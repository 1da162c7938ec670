"""Logit-level KL policies: the student's full-vocabulary logits against the teacher's.

Q is the student (the trained policy), P the teacher, both over the vocabulary V at one
position; every method is the reverse KL(Q‖P) or the generalised Jensen-Shannon divergence
of GKD (arXiv 2306.13649) and baidu-baige/LoongSage `coda/algorithms/kl_policy.py`:

    full_kl    KL(Q‖P) = Σ_v Q_v (log Q_v − log P_v)
    full_jsd   JSD_β = β·KL(P‖M) + (1−β)·KL(Q‖M),  M = βP + (1−β)Q
    topk_kl    KL(Q̂‖P̂) over the teacher's top-k set S, both renormalised on S:
               Q̂ = Q_S / Σ_S Q, P̂ = P_S / Σ_S P
    topk_jsd   JSD_β with P taken as 0 outside S (not renormalised) and Q full, so the
               tokens outside S add the tail term (1−β)·(1 − Σ_S Q)·(−log(1−β))

Contract (docs/plugins.md, kl_policy): ``fn(student_logits [c, V], teacher_logprobs,
teacher_ids, beta) -> [c]`` for one chunk of c positions, where for the ``full`` methods
``teacher_logprobs`` is the teacher's log-softmax over V ([c, V], rebuilt from its hidden
states) and ``teacher_ids`` is None, and for the ``topk`` methods they are the teacher's
top-k log-probs (normalised over V) and their token ids ([c, k] each). Values and gradients
are with respect to ``student_logits`` only.

Gradients: ``full_kl``, ``full_jsd`` and ``topk_jsd`` have closed forms with respect to the
logits (baidu-baige/LoongSage's ``vocab_parallel_kl``), so they are custom autograd functions that
keep only their inputs and two [c] statistics for the backward and rebuild Q there, instead of the
softmax, log and product intermediates autograd would keep ([c, V] each):

    full_kl    ∂/∂z = Q ⊙ (d − KL),           d = log Q − log P
    full_jsd   ∂/∂z = (1−β)·Q ⊙ (A − Σ Q A),  A = log Q − log M
    topk_jsd   the same with A = −log(1−β) outside S (there M = (1−β)Q)

``topk_kl`` depends on the logits of S only (Q̂ is the softmax of z_S), so plain autograd on
the gathered [c, k] logits is already the cheap form. Tests check every method, value and
gradient, against float64 implementations written from the formulas above.
"""

from __future__ import annotations

import math

import torch


def topk_kl(student_logits: torch.Tensor, teacher_logprobs: torch.Tensor,
            teacher_ids: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """KL(Q̂‖P̂) on the teacher's top-k tokens, student and teacher renormalised over them."""
    log_q = torch.log_softmax(student_logits.gather(-1, teacher_ids), dim=-1)
    log_p = torch.log_softmax(teacher_logprobs, dim=-1)
    return (log_q.exp() * (log_q - log_p)).sum(-1)


class _FullKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        log_q = logits - lse
        kl = (log_q.exp() * (log_q - teacher_logprobs)).sum(-1)
        ctx.save_for_backward(logits, teacher_logprobs, lse, kl)
        return kl

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, teacher_logprobs, lse, kl = ctx.saved_tensors
        log_q = logits - lse
        q = log_q.exp()
        return q * (log_q - teacher_logprobs - kl.unsqueeze(-1)) * grad.unsqueeze(-1), None


def full_kl(student_logits: torch.Tensor, teacher_logprobs: torch.Tensor,
            teacher_ids: torch.Tensor | None = None, beta: float = 0.5) -> torch.Tensor:
    """KL(Q‖P) over the whole vocabulary."""
    return _FullKL.apply(student_logits, teacher_logprobs)


def _log_mixture(log_p: torch.Tensor, log_q: torch.Tensor, beta: float) -> torch.Tensor:
    """log M, M = βP + (1−β)Q, from log-probabilities (stable where either is tiny)."""
    return torch.logaddexp(log_p + math.log(beta), log_q + math.log1p(-beta))


class _FullJSD(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, teacher_logprobs: torch.Tensor, beta: float) -> torch.Tensor:
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        log_q = logits - lse
        log_m = _log_mixture(teacher_logprobs, log_q, beta)
        to_m_p = (teacher_logprobs.exp() * (teacher_logprobs - log_m)).sum(-1)
        to_m_q = (log_q.exp() * (log_q - log_m)).sum(-1)
        ctx.save_for_backward(logits, teacher_logprobs, lse, to_m_q)
        ctx.beta = beta
        return beta * to_m_p + (1.0 - beta) * to_m_q

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, teacher_logprobs, lse, to_m_q = ctx.saved_tensors
        log_q = logits - lse
        a = log_q - _log_mixture(teacher_logprobs, log_q, ctx.beta)
        scale = (1.0 - ctx.beta) * grad.unsqueeze(-1)
        return scale * log_q.exp() * (a - to_m_q.unsqueeze(-1)), None, None


def full_jsd(student_logits: torch.Tensor, teacher_logprobs: torch.Tensor,
             teacher_ids: torch.Tensor | None = None, beta: float = 0.5) -> torch.Tensor:
    """JSD_β(P‖Q) over the whole vocabulary."""
    return _FullJSD.apply(student_logits, teacher_logprobs, beta)


def _topk_jsd_parts(logits, lse, teacher_logprobs, teacher_ids, beta):
    """(log Q_S, log M_S, KL(Q‖M)) with the tail outside S folded into KL(Q‖M)."""
    log_q_s = logits.gather(-1, teacher_ids) - lse
    log_m_s = _log_mixture(teacher_logprobs, log_q_s, beta)
    q_s = log_q_s.exp()
    tail = (1.0 - q_s.sum(-1)) * -math.log1p(-beta)
    to_m_q = (q_s * (log_q_s - log_m_s)).sum(-1) + tail
    return log_q_s, log_m_s, to_m_q


class _TopKJSD(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, teacher_logprobs, teacher_ids, beta: float) -> torch.Tensor:
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        log_q_s, log_m_s, to_m_q = _topk_jsd_parts(logits, lse, teacher_logprobs, teacher_ids, beta)
        to_m_p = (teacher_logprobs.exp() * (teacher_logprobs - log_m_s)).sum(-1)
        ctx.save_for_backward(logits, teacher_logprobs, teacher_ids, lse)
        ctx.beta = beta
        return beta * to_m_p + (1.0 - beta) * to_m_q

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, teacher_logprobs, teacher_ids, lse = ctx.saved_tensors
        beta = ctx.beta
        log_q_s, log_m_s, to_m_q = _topk_jsd_parts(logits, lse, teacher_logprobs, teacher_ids, beta)
        outside = -math.log1p(-beta)  # A_j for every j outside S
        scale = (1.0 - beta) * grad.unsqueeze(-1)
        q = (logits - lse).exp()
        out = scale * q * (outside - to_m_q.unsqueeze(-1))
        inside = scale * log_q_s.exp() * (log_q_s - log_m_s - outside)
        return out.scatter_add(-1, teacher_ids, inside), None, None, None


def topk_jsd(student_logits: torch.Tensor, teacher_logprobs: torch.Tensor,
             teacher_ids: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """JSD_β with the teacher's top-k (P = 0 outside them) against the student's full Q."""
    return _TopKJSD.apply(student_logits, teacher_logprobs, teacher_ids, beta)


@torch.no_grad()
def topk_overlap(student_logits: torch.Tensor, teacher_ids: torch.Tensor) -> torch.Tensor:
    """[c]: the share of the teacher's top-k tokens that are also in the student's top-k."""
    k = teacher_ids.shape[-1]
    student_ids = student_logits.topk(k, dim=-1).indices
    both = torch.cat([student_ids, teacher_ids], dim=-1).sort(dim=-1).values
    return (both[:, 1:] == both[:, :-1]).sum(-1).to(student_logits.dtype) / k
