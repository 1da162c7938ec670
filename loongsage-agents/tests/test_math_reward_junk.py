"""Format credit goes only to a boxed answer that is a math expression."""

import pytest

from loongsage_agents.rewards.math import math_reward
from loongsage_agents.rewards.params import MathRewardParams

PARAMS = MathRewardParams(correct_score=1.0, format_score=0.1, no_answer_score=0.0)


@pytest.mark.parametrize("text", ["\\boxed{ =}", "\\boxed{=}", "2 = = = \\boxed{ =}"])
def test_junk_in_a_box_earns_no_format_credit(text):
    assert math_reward(text, "7", PARAMS) == {"score": 0.0, "correct": False, "boxed": False}


def test_a_wrong_number_in_a_box_earns_format_credit():
    assert math_reward("\\boxed{8}", "7", PARAMS) == {"score": 0.1, "correct": False, "boxed": True}


def test_last_number_fallback_scores_correctness_without_format_credit():
    params = MathRewardParams(correct_score=1.0, format_score=0.1, accept_last_number=True)
    assert math_reward("4 + 5 = 9", "9", params) == {"score": 1.0, "correct": True, "boxed": False}
    assert math_reward("4 + 5 = 8", "9", params) == {"score": 0.0, "correct": False, "boxed": False}
    assert math_reward("4 + 5 = 9", "9", PARAMS)["score"] == 0.0  # off by default
