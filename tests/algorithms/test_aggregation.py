"""Loss aggregation: hand-computed values per mode and independence of the micro-batch split."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loongsage.algorithms.aggregation import AGG_MODES, aggregate

LOSS = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 5.0, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
TOKENS, SEQS = 5.0, 2.0  # valid tokens; rows with a loss token


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token_mean", (1 + 2 + 3 + 4 + 5) / 5),
        ("seq_mean_token_mean", ((1 + 2 + 3) / 3 + (4 + 5) / 2) / 2),
        ("seq_mean_token_sum", ((1 + 2 + 3) + (4 + 5)) / 2),
        ("seq_mean_token_sum_norm", ((1 + 2 + 3) + (4 + 5)) / (2 * 4)),
    ],
)
def test_modes_by_hand(mode, expected):
    assert aggregate(LOSS, MASK, mode, TOKENS, SEQS).item() == pytest.approx(expected)


def test_norm_len_constant_is_used():
    out = aggregate(LOSS, MASK, "seq_mean_token_sum_norm", TOKENS, SEQS, norm_len=10)
    assert out.item() == pytest.approx(15 / (2 * 10))


def test_keep_removes_numerator_only():
    keep = torch.ones_like(MASK)
    keep[0, 1] = 0.0
    assert aggregate(LOSS, MASK, "token_mean", TOKENS, SEQS, keep=keep).item() == pytest.approx((1 + 3 + 4 + 5) / 5)
    assert aggregate(LOSS, MASK, "seq_mean_token_mean", TOKENS, SEQS, keep=keep).item() == pytest.approx(
        ((1 + 3) / 3 + (4 + 5) / 2) / 2
    )


def test_masked_infinities_do_not_leak():
    loss = LOSS.clone()
    loss[0, 3] = float("inf")
    assert torch.isfinite(aggregate(loss, MASK, "token_mean", TOKENS, SEQS))


def test_unknown_mode_names_the_choices():
    with pytest.raises(ValueError, match="token_mean"):
        aggregate(LOSS, MASK, "token-mean", TOKENS, SEQS)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    cuts=st.lists(st.integers(1, 7), min_size=0, max_size=4, unique=True),
    mode=st.sampled_from(AGG_MODES),
)
def test_sum_over_micro_batches_equals_full_batch(seed, cuts, mode):
    g = torch.Generator().manual_seed(seed)
    loss = torch.randn(8, 6, generator=g, dtype=torch.float64)
    mask = (torch.rand(8, 6, generator=g) > 0.4).double()
    tokens, seqs = mask.sum().item(), (mask.sum(-1) > 0).sum().item()
    full = aggregate(loss, mask, mode, tokens, seqs)
    bounds = [0, *sorted(cuts), 8]
    parts = sum(aggregate(loss[a:b], mask[a:b], mode, tokens, seqs) for a, b in zip(bounds, bounds[1:]) if b > a)
    assert float(parts) == pytest.approx(float(full), abs=1e-12)
