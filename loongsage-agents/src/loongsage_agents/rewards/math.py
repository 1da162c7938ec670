"""Math reward: is the last ``\\boxed{...}`` answer equal to the ground truth?

The boxed answer is located with a brace-balancing scan (``\\boxed{\\frac{1}{2}}`` nests
braces, which regex-only extractors get wrong), and the *last* box wins, as in DAPO and
verl's ``math_dapo``. Equality is decided by Hugging Face's ``math-verify`` (symbolic:
``\\frac{1}{2}`` = ``0.5`` = ``1/2``; ``x = 3`` = ``3``), never by string comparison.

The result is a dict, ``{"score", "correct", "boxed"}``, so training can log the format
rate and the accuracy separately from the shaped score. DAPO-Math-17k's prompts ask for a
final ``Answer: X`` line instead of a box; ``accept_answer_line`` reads the last such line
when there is no box (``boxed`` then means "an answer in the requested format").
``accept_last_number`` is the flexible fallback for small models that state the result
without the requested format: the last number in the text is checked for correctness
(``boxed`` stays false, so the format credit still rewards learning the format).

Answers too costly to compare never reach sympy: ``math_guards.costly_answer`` rejects,
from the text alone, overlong answers and huge factorials and powers
(``\\boxed{99999999!}``); such an answer is wrong, keeps its format credit, and its result
names the guard in ``unchecked``.

math-verify enforces its own timeouts (``timeout_seconds`` per parse and per comparison)
with ``SIGALRM``, which only works in a process's main thread. In a run every reward call
runs in the main thread of a reward worker process (``loongsage.deadline``), so they apply,
and the call's deadline (``reward.timeout_s``, default 30 s) backs them up: it kills the
worker when sympy is stuck in C code, where no signal handler runs. Called from another
thread (a test's, a Ray async actor's), the reward runs without math-verify's timeouts rather
than failing, and math-verify's warning about that, logged on every call, is filtered out
(other warnings still show).
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

from math_verify import parse, verify
from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig

from loongsage_agents.rewards.math_guards import costly_answer
from loongsage_agents.rewards.params import MathRewardParams


class _DropDisabledTimeoutWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropDisabledTimeoutWarning())

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_EXTRACTION = (LatexExtractionConfig(), ExprExtractionConfig())
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_ANSWER_LINE = re.compile(r"^\s*\**Answer\**\s*:\s*(.+?)\s*$", re.MULTILINE | re.IGNORECASE)


def last_boxed(text: str) -> str | None:
    """Return the contents of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``.

    Braces are balanced, so nested groups survive. ``\\boxed 7`` (no braces) yields ``"7"``.
    An unclosed last box yields ``None``.
    """
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    i = start + len(cmd)
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text):
        return None
    if text[i] != "{":
        end = i
        while end < len(text) and not text[end].isspace() and text[end] != "$":
            end += 1
        return text[i:end] or None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def _timeout(params: MathRewardParams) -> int | None:
    if threading.current_thread() is not threading.main_thread():
        return None
    return params.timeout_seconds if params.timeout_seconds > 0 else None


def _as_latex(value: Any) -> str:
    text = str(value).strip()
    if last_boxed(text) is not None:
        text = last_boxed(text) or ""
    if text.startswith("$") and text.endswith("$"):
        return text
    return f"${text}$"


def answers_match(answer: str, ground_truth: Any, params: MathRewardParams | None = None) -> bool:
    """Whether ``answer`` (LaTeX without delimiters) equals ``ground_truth`` for math-verify."""
    params = params or MathRewardParams()
    timeout = _timeout(params)
    gold = parse(_as_latex(ground_truth), _EXTRACTION, parsing_timeout=timeout)
    pred = parse(f"${answer}$", _EXTRACTION, parsing_timeout=timeout)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout))


def _parses(answer: str, params: MathRewardParams) -> bool:
    """Whether the answer is a math expression at all (``\\boxed{ =}`` is not, and earns no
    format credit: otherwise a policy learns to box junk)."""
    parsed = parse(f"${answer}$", _EXTRACTION, parsing_timeout=_timeout(params))
    return any(not isinstance(item, str) for item in parsed)  # a sympy object, not just the raw text


def math_reward(
    sample_text: str, ground_truth: Any, params: MathRewardParams | None = None, **context: Any
) -> dict[str, Any]:
    """Score a response by its last boxed answer: correct, boxed-but-wrong, or no answer."""
    params = params or MathRewardParams()
    if ground_truth is None:
        raise ValueError("math reward: the prompt has no ground truth (dataset ground-truth field)")
    answer = last_boxed(sample_text)
    if answer is None and params.accept_answer_line:
        lines = _ANSWER_LINE.findall(sample_text)
        answer = lines[-1].strip("$* ") if lines else None
    if answer is not None and answer.strip():
        unchecked = costly_answer(answer.strip(), params)
        if unchecked:
            return {"score": float(params.format_score), "correct": False, "boxed": True,
                    "unchecked": unchecked}
    if answer is None or not answer.strip() or not _parses(answer.strip(), params):
        numbers = _NUMBER.findall(sample_text) if params.accept_last_number else []
        last = numbers[-1] if numbers else None
        if last and not costly_answer(last, params) and answers_match(last, ground_truth, params):
            return {"score": float(params.correct_score), "correct": True, "boxed": False}
        return {"score": float(params.no_answer_score), "correct": False, "boxed": False}
    correct = answers_match(answer.strip(), ground_truth, params)
    score = params.correct_score if correct else params.format_score
    return {"score": float(score), "correct": correct, "boxed": True}
