"""Cheap checks that keep costly garbage away from sympy, decided from the answer's text.

A policy under RL writes whatever it writes, including answers that are valid math whose
evaluation does not end in practice: ``\\boxed{99999999!}`` or ``9^{9^{9}}`` keep sympy busy
for minutes (in C code, where no signal reaches it). math-verify's own timeouts and the
reward call's deadline stop them, but each would still cost a worker seconds and its
process. ``costly_answer`` decides in microseconds that an answer is not worth comparing:

* longer than ``max_answer_chars`` characters;
* a factorial of an integer above ``max_factorial``, or of a bracketed expression that holds a
  power or a factorial (``(10^8)!``);
* a power whose exponent is an integer above ``max_exponent``, or holds a power or a
  factorial itself (``9^{9^{9}}``, ``2^{100!}``).

A limit of 0 switches its guard off. The guards are deliberately crude: a genuine answer
beyond one (``2^{2^{5}}``) is scored wrong, so the default limits sit far above what final
answers hold and far below what is slow (``10000!`` and ``2^{100000}`` take milliseconds).
"""

from __future__ import annotations

import re

from loongsage_agents.rewards.params import MathRewardParams

_NESTED = re.compile(r"\^|\*\*|!(?!=)")
_INTEGER = re.compile(r"\d+")
_CLOSING = {")": "(", "}": "{", "]": "["}
_OPENING = {v: k for k, v in _CLOSING.items()}


def _above(digits: str, limit: int) -> bool:
    digits = digits.lstrip("0") or "0"
    return len(digits) > len(str(limit)) or int(digits) > limit


def _bracketed(text: str, at: int) -> str | None:
    """The contents of the bracketed group that opens or closes at ``text[at]``."""
    forward = text[at] in _OPENING
    mate, step = (_OPENING[text[at]], 1) if forward else (_CLOSING[text[at]], -1)
    depth, i = 0, at
    while 0 <= i < len(text):
        if text[i] == text[at]:
            depth += 1
        elif text[i] == mate:
            depth -= 1
            if depth == 0:
                low, high = sorted((at, i))
                return text[low + 1: high]
        i += step
    return None


def _operand_checks(operand: str | None, limit: int, what: str, key: str) -> str | None:
    """Why ``operand`` (a factorial's argument, an exponent) is too costly, or ``None``."""
    if operand is None or not limit:
        return None
    if _NESTED.search(operand):
        return f"{what} {operand!r} holds a power or a factorial"
    for digits in _INTEGER.findall(operand):
        if _above(digits, limit):
            number = digits.lstrip("0") or "0"
            shown = number if operand.strip() == digits else f"{operand!r}, holding {number},"
            return f"{what} {shown} is above {key}={limit}"
    return None


def _factorials(text: str, limit: int) -> str | None:
    for match in re.finditer(r"!(?!=)", text):
        end = match.start() - 1
        while end >= 0 and text[end].isspace():
            end -= 1
        if end < 0:
            continue
        if text[end].isdigit():
            start = end
            while start > 0 and text[start - 1].isdigit():
                start -= 1
            operand = text[start: end + 1]
        elif text[end] in _CLOSING:
            operand = _bracketed(text, end)
        else:
            continue
        reason = _operand_checks(operand, limit, "the factorial of", "max_factorial")
        if reason:
            return reason
    return None


def _powers(text: str, limit: int) -> str | None:
    for match in re.finditer(r"\^|\*\*", text):
        start = match.end()
        while start < len(text) and text[start].isspace():
            start += 1
        if start >= len(text):
            continue
        if text[start] in _OPENING:
            operand = _bracketed(text, start)
        else:
            digits = _INTEGER.match(text, start)
            operand = digits.group() if digits else None
        reason = _operand_checks(operand, limit, "the exponent", "max_exponent")
        if reason:
            return reason
    return None


def costly_answer(answer: str, params: MathRewardParams) -> str | None:
    """Why ``answer`` is too costly to compare symbolically, or ``None`` when it is cheap."""
    if params.max_answer_chars and len(answer) > params.max_answer_chars:
        return f"answer of {len(answer)} characters is longer than max_answer_chars={params.max_answer_chars}"
    return _factorials(answer, params.max_factorial) or _powers(answer, params.max_exponent)
