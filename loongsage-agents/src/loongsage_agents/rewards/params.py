"""Typed parameters of the rewards in this package (torch-free, imported by ``plugin.py``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MathRewardParams:
    """Math answer reward: the last \\boxed{} answer checked against the ground truth by math-verify."""

    correct_score: float = 1.0  # boxed answer equal to the ground truth
    format_score: float = 0.0  # boxed answer present but wrong
    no_answer_score: float = 0.0  # no \boxed{} answer at all
    accept_answer_line: bool = False  # also read a last "Answer: X" line (DAPO-Math prompts ask for it)
    # else fall back to the last number in the text (lm-eval's "flexible extract"); such an answer
    # can be correct but never earns format credit
    accept_last_number: bool = False
    timeout_seconds: int = 5  # math-verify's own limit per parse/verify (SIGALRM; see rewards.math)
    max_answer_chars: int = 300  # longer answers are not compared (wrong); 0 = no limit
    max_factorial: int = 10000  # n! above this, or of a power/factorial, is not compared; 0 = off
    max_exponent: int = 100000  # a^b with b above this, or b a power/factorial, is not compared; 0 = off
