"""The embedded engine's batched sampler: per-row settings are honoured (greedy rows, top-k,
top-p, min-p, temperature) and the reported logprob is always the raw model distribution's."""

from __future__ import annotations

from dataclasses import replace

import torch

from loongsage.engines.embedded_rollout.sampler import RowSettings, draw, sample

LOGITS = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]] * 4)
RAW = LOGITS.log_softmax(-1)


def draws(settings: RowSettings, n: int = 400) -> torch.Tensor:
    """``n`` draws per row in one batched call: returns [n, B]."""
    s = settings
    many = replace(s, temperature=s.temperature.repeat(n), top_p=s.top_p.repeat(n),
                   top_k=s.top_k.repeat(n), min_p=s.min_p.repeat(n))
    uniforms = torch.rand(n * len(s.temperature), dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    return sample(LOGITS.repeat(n, 1), many, uniforms)[0].view(n, -1)


def test_rows_follow_their_own_settings():
    s = RowSettings.build(temperature=[0.0, 1.0, 1.0, 1.0], top_p=[1.0, 1.0, 0.5, 1.0],
                          top_k=[-1, 2, -1, -1], min_p=[0.0, 0.0, 0.0, 0.3])
    got = draws(s)
    assert (got[:, 0] == 0).all()  # greedy row
    assert set(got[:, 1].tolist()) == {0, 1}  # top-k 2: both kept, nothing else
    assert set(got[:, 2].tolist()) == {0}  # p(token 0) = 0.61 >= top_p 0.5: only it survives
    # min-p 0.3 keeps tokens with p >= 0.3 * p_max = 0.18: tokens 0 and 1 (0.61, 0.22)
    assert set(got[:, 3].tolist()) == {0, 1}


def test_unfiltered_sampling_matches_the_model_distribution():
    s = RowSettings.build([1.0] * 4, [1.0] * 4, [-1] * 4, [0.0] * 4)
    got = draws(s, 1000).flatten()
    freq = torch.bincount(got, minlength=5).float() / got.numel()
    assert torch.allclose(freq, RAW[0].exp(), atol=0.03)


def test_low_temperature_sharpens_but_logprob_stays_raw():
    s = RowSettings.build([0.2] * 4, [1.0] * 4, [-1] * 4, [0.0] * 4)
    tokens, logprobs = sample(LOGITS, s, torch.rand(4, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))
    assert torch.equal(logprobs, RAW.gather(-1, tokens[:, None]).squeeze(-1))
    assert (draws(s)[:, 0] == 0).float().mean() > 0.95  # p = 0.99 at T=0.2 vs 0.61 at T=1


def test_inverse_cdf_draw_follows_unnormalised_rows_and_never_draws_a_zero():
    """``draw`` replaced ``torch.multinomial`` (1 ms a row at a 49k vocabulary): it must draw
    the same distribution, from rows that need not sum to 1, and never a token of mass 0."""
    probs = torch.tensor([[0.0, 3.0, 1.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0, 2.0]]).repeat(4000, 1)
    got = draw(probs, torch.rand(8000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))).view(4000, 2)
    first = torch.bincount(got[:, 0], minlength=5).float() / 4000
    second = torch.bincount(got[:, 1], minlength=5).float() / 4000
    assert torch.allclose(first, torch.tensor([0.0, 0.75, 0.25, 0.0, 0.0]), atol=0.03)
    assert torch.allclose(second, torch.tensor([0.5, 0.0, 0.0, 0.0, 0.5]), atol=0.03)
    assert first[[0, 3, 4]].sum() == 0 and second[1:4].sum() == 0
