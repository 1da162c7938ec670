"""Full-vocabulary distillation from rebuilt teacher logits equals it from materialised ones.

The path under test is the one a run takes: the teacher engine returns hidden states, the
student's chunked LM head evaluates the distillation term chunk by chunk, rebuilding each
chunk's teacher logits with the teacher's own LM head read from its checkpoint
(``teacher_heads``). The reference materialises both models' logits for the whole batch and
computes KL(Q‖P) and JSD from them directly. Loss values and the gradient of every student
parameter must agree, for two teachers in one batch (rows routed to each) and a row with
no teacher.
"""

from __future__ import annotations

import pytest
import torch

from loongsage.plugin import load_causal_lm
from loongsage.plugin import token_scores
from loongsage.plugin.testing import registries_with
from loongsage_distill.teacher_engine import EmbeddedTeacherEngine, Job, Wants
from loongsage_distill.train_term import HIDDEN, TEACHER, kl_logit_term


def ragged(n=5, length=14, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 500, (n, length), generator=g)
    mask = torch.ones(n, length, dtype=torch.long)
    for row in range(n):
        mask[row, length - 2 * row:] = 0
    return ids, mask


def materialised_logprobs(model, ids, mask):
    hidden = model.base_model(input_ids=ids, attention_mask=mask,
                              position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).last_hidden_state
    return torch.log_softmax(model.get_output_embeddings()(hidden[:, :-1]).float(), -1)


def reference(name, student_lp, teacher_lp, beta):
    q, p = student_lp.exp(), teacher_lp.exp()
    if name == "full_kl":
        return (q * (student_lp - teacher_lp)).sum(-1)
    m = beta * p + (1 - beta) * q
    return beta * (p * (teacher_lp - m.log())).sum(-1) + (1 - beta) * (q * (student_lp - m.log())).sum(-1)


def grads(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ["full_kl", "full_jsd"])
def test_rebuilt_teacher_logits_give_the_materialised_loss_and_gradients(tiny_model_dir, teacher_dirs, name):
    student = load_causal_lm(tiny_model_dir, "float32")
    ids, mask = ragged()
    row_teacher = torch.tensor([0, 1, 0, -1, 1])
    engines = [EmbeddedTeacherEngine([{"name": f"t{i}", "path": str(d), "key": f"opd.teachers[{i}]"}])
               for i, d in enumerate(teacher_dirs[:2])]
    hidden = torch.zeros(*ids.shape, 256)
    for t, engine in enumerate(engines):
        rows = (row_teacher == t).nonzero().squeeze(-1)
        (out,), _ = engine.forward([Job(0, ids[rows], mask[rows])], Wants(entropy=False, hidden=True))
        hidden[rows] = out["hidden"]
    loss_mask = mask[:, 1:].float() * (row_teacher >= 0).float()[:, None]

    method = registries_with().resolve("kl_policy", name, "opd.gkd_kl_method")
    term = kl_logit_term(method, {"beta": 0.3, "topk": 4, "head_paths": tuple(map(str, teacher_dirs[:2])),
                                "fp32": True})
    extras = {HIDDEN: hidden, TEACHER: row_teacher}
    values = token_scores(student, ids, mask, chunk_tokens=7, term=term, extras=extras).values[:, 1:, 0]
    loss = (values * loss_mask).sum() / loss_mask.sum()
    got = grads(student, loss)

    teachers = [load_causal_lm(d, "float32") for d in teacher_dirs[:2]]
    with torch.no_grad():
        teacher_lp = torch.stack([materialised_logprobs(t, ids, mask) for t in teachers])
    chosen = teacher_lp[row_teacher.clamp(min=0), torch.arange(len(ids))]
    want_values = reference(name, materialised_logprobs(student, ids, mask), chosen, 0.3)
    want_loss = (want_values * loss_mask).sum() / loss_mask.sum()
    torch.testing.assert_close(values * loss_mask, want_values.detach() * loss_mask, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, want_loss, atol=1e-6, rtol=1e-6)
    want = grads(student, want_loss)
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=1e-5, rtol=1e-4)
    assert loss > 0.01  # the teachers really differ from the student
