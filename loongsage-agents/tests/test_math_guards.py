"""Answers too costly to compare never reach sympy: each guard, its message, its off switch,
and answers just inside the limits that are still compared."""

from __future__ import annotations

import pytest

from loongsage_agents.rewards.math import math_reward
from loongsage_agents.rewards.math_guards import costly_answer
from loongsage_agents.rewards.params import MathRewardParams

PARAMS = MathRewardParams(format_score=0.25)


@pytest.mark.parametrize("answer, reason", [
    ("99999999!", "the factorial of 99999999 is above max_factorial=10000"),
    ("(10^8)!", "the factorial of '10^8' holds a power or a factorial"),
    ("{10001}!", "the factorial of 10001 is above max_factorial=10000"),
    ("(3 + 20000)!", "the factorial of '3 + 20000', holding 20000, is above max_factorial=10000"),
    ("9^{9^{9}}", "the exponent '9^{9}' holds a power or a factorial"),
    ("2^{100!}", "the exponent '100!' holds a power or a factorial"),
    ("10^{100001}", "the exponent 100001 is above max_exponent=100000"),
    ("2**99999999", "the exponent 99999999 is above max_exponent=100000"),
    ("1" * 301, "answer of 301 characters is longer than max_answer_chars=300"),
])
def test_costly_answers_are_named(answer, reason):
    assert costly_answer(answer, PARAMS) == reason


@pytest.mark.parametrize("answer", ["10000!", "2^{100000}", "\\frac{1}{2}", "x^2 + 3x", "5!", "3 != 4",
                                    "2^{10} \\cdot 3^{4}", "(n+1)!"])
def test_cheap_answers_pass(answer):
    assert costly_answer(answer, PARAMS) is None


def test_a_guarded_answer_is_wrong_keeps_format_credit_and_says_why():
    result = math_reward("so \\boxed{99999999!}", "3", PARAMS)
    assert result == {"score": 0.25, "correct": False, "boxed": True,
                      "unchecked": "the factorial of 99999999 is above max_factorial=10000"}
    assert math_reward("\\boxed{3!}", "6", PARAMS) == {"score": 1.0, "correct": True, "boxed": True}


def test_a_limit_of_zero_turns_its_guard_off():
    off = MathRewardParams(max_factorial=0, max_exponent=0, max_answer_chars=0)
    assert costly_answer("99999999!", off) is costly_answer("9^{9^{9}}", off) is costly_answer("1" * 999, off) is None


def test_the_last_number_fallback_skips_an_overlong_number():
    params = MathRewardParams(accept_last_number=True)
    assert math_reward("it is " + "7" * 400, "7" * 400, params)["correct"] is False
    assert math_reward("it is 42", "42", params)["correct"] is True
