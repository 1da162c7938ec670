"""The math reward on tricky answers: last box wins, nested braces, equivalent forms, no box."""

from __future__ import annotations

import threading

import pytest

from loongsage_agents.rewards.math import last_boxed, math_reward
from loongsage_agents.rewards.params import MathRewardParams


@pytest.mark.parametrize(
    "text, expected",
    [
        ("the answer is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed{3} hmm, no: \\boxed{4}", "4"),
        ("\\fbox{5} then \\boxed{6}", "6"),
        ("\\boxed{6} then \\fbox{5}", "5"),
        ("\\boxed 7 apples", "7"),
        ("\\boxed{ 7 }", " 7 "),
        ("\\boxed{\\text{12 apples}}", "\\text{12 apples}"),
        ("no box here: 42", None),
        ("unclosed \\boxed{12", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


CORRECT = {"score": 1.0, "correct": True, "boxed": True}
WRONG = {"score": 0.0, "correct": False, "boxed": True}
NONE = {"score": 0.0, "correct": False, "boxed": False}


@pytest.mark.parametrize(
    "text, truth, expected",
    [
        ("so \\boxed{\\frac{1}{2}}", "0.5", CORRECT),  # fraction vs decimal
        ("\\boxed{0.5}", "\\frac{1}{2}", CORRECT),
        ("\\boxed{\\dfrac{3}{4}}", "3/4", CORRECT),
        ("\\boxed{ 7 }", 7, CORRECT),  # spaces, integer ground truth
        ("\\boxed{3} no wait \\boxed{4}", "4", CORRECT),  # last box wins
        ("\\boxed{3} no wait \\boxed{4}", "3", WRONG),
        ("$\\boxed{-3}$", "-3", CORRECT),
        ("\\boxed{x = 3}", "3", CORRECT),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", CORRECT),
        ("\\boxed{1,000}", "1000", CORRECT),
        ("\\boxed{12}", "\\boxed{12}", CORRECT),  # ground truth given boxed
        ("\\boxed{13}", "12", WRONG),
        ("\\boxed{}", "12", NONE),  # empty box is no answer
        ("The answer is 12.", "12", NONE),  # right number, but not boxed
    ],
)
def test_math_reward(text, truth, expected):
    assert math_reward(text, truth, MathRewardParams()) == expected


def test_scores_are_configurable():
    params = MathRewardParams(correct_score=2.0, format_score=0.1, no_answer_score=-1.0)
    assert math_reward("\\boxed{5}", "5", params)["score"] == 2.0
    assert math_reward("\\boxed{6}", "5", params)["score"] == 0.1
    assert math_reward("5", "5", params)["score"] == -1.0


def test_missing_ground_truth_is_an_error():
    with pytest.raises(ValueError, match="no ground truth"):
        math_reward("\\boxed{5}", None)


def test_works_off_the_main_thread():
    """math-verify's SIGALRM timeouts cannot run in threads; the reward must still work there."""
    results = []
    thread = threading.Thread(target=lambda: results.append(math_reward("\\boxed{\\frac{2}{4}}", "1/2")))
    thread.start()
    thread.join()
    assert results == [CORRECT]


@pytest.mark.parametrize(
    "text, truth, accept, expected",
    [
        ("work...\nAnswer: 34", "34", True, CORRECT),
        ("Answer: 3\nwait\nAnswer: $\\frac{5}{2}$", "2.5", True, CORRECT),  # last line wins
        ("**Answer:** 7", "7", True, CORRECT),
        ("\\boxed{9}\nAnswer: 8", "9", True, CORRECT),  # a box takes precedence
        ("work...\nAnswer: 34", "34", False, NONE),  # off by default
        ("Answer: 35", "34", True, WRONG),
    ],
)
def test_dapo_answer_line(text, truth, accept, expected):
    assert math_reward(text, truth, MathRewardParams(accept_answer_line=accept)) == expected
