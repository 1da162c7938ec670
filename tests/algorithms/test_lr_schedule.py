"""The learning-rate schedule of the warm start: warm-up, then constant, linear or cosine decay."""

from __future__ import annotations

import math

import pytest

from loongsage.algorithms.lr_schedule import learning_rate


def test_warm_up_rises_linearly_to_the_peak_then_each_decay_follows_its_curve():
    rates = {d: [learning_rate(s, 12, 0.5, warmup_steps=2, decay=d) for s in range(12)]
             for d in ("constant", "linear", "cosine")}
    for decay, curve in rates.items():
        assert curve[:3] == [0.25, 0.5, 0.5], decay  # step 2 is the first after the warm-up
    assert rates["constant"][2:] == [0.5] * 10
    assert rates["linear"][2:] == pytest.approx([0.5 * (1 - i / 10) for i in range(10)])
    assert rates["cosine"][2:] == pytest.approx([0.25 * (1 + math.cos(math.pi * i / 10)) for i in range(10)])
    assert rates["linear"][-1] == pytest.approx(0.05) and rates["cosine"][-1] > 0  # the last step trains


def test_no_warm_up_starts_at_the_peak_and_a_single_step_is_not_a_division_by_zero():
    assert learning_rate(0, 5, 1e-3, decay="linear") == 1e-3
    assert learning_rate(0, 1, 1e-3, warmup_steps=1, decay="cosine") == 1e-3


def test_an_unknown_decay_names_the_field_and_the_choices():
    with pytest.raises(ValueError, match=r"trainer.sft.lr_decay: expected one of \['constant', 'cosine', "
                                         r"'linear'\], got 'cosin'"):
        learning_rate(0, 5, 1e-3, decay="cosin", key="trainer.sft.lr_decay")
