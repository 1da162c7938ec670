"""The bug families of the ``code_repair`` dataset: a correct function, the one edit that
breaks it, and how to draw its arguments.

Each family draws a ``Variant`` from a seeded ``random.Random``: the function's name and
constants vary, so tasks of one family differ in their source text, and the bug is a single
textual replacement in the reference source (``reference.replace(fixed, broken)``, which
must match exactly once), so the reference *is* the fix. ``edge(rng)`` draws arguments on
which the bug shows (the dataset checks this for every task and refuses a family whose
edge case does not tell the two versions apart); ``args(rng)`` draws ordinary arguments,
which may or may not expose it. Arguments are ints, strings and lists of them only, so a
case's ``repr`` is valid Python in a test file.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Variant:
    """One function of a family: its name, the correct source, and the bug as an edit."""

    family: str
    function: str
    reference: str  # the correct module source (the fix)
    fixed: str  # text of the reference that the bug replaces (exactly one occurrence)
    broken: str  # what replaces it in the buggy source
    args: Callable[[random.Random], tuple[Any, ...]]
    edge: Callable[[random.Random], tuple[Any, ...]]

    @property
    def buggy(self) -> str:
        if self.reference.count(self.fixed) != 1:
            raise ValueError(f"code_repair family {self.family!r}: the bug's text {self.fixed!r} must "
                             f"occur once in the reference of {self.function!r}")
        return self.reference.replace(self.fixed, self.broken)


_WORDS = ("apple", "kiwi", "fig", "melon", "plum", "pear", "lime", "date", "grape", "banana")


def _ints(rng: random.Random, low: int, high: int, min_len: int = 1, max_len: int = 6) -> list[int]:
    return [rng.randint(low, high) for _ in range(rng.randint(min_len, max_len))]


def off_by_one_range(rng: random.Random) -> Variant:
    name, k = rng.choice(["scaled_sum", "weighted_total", "sum_of_multiples", "triangle_times"]), rng.randint(2, 9)
    i = rng.choice(["i", "j", "step"])
    source = (f"def {name}(n):\n"
              f'    """Return the sum of {i} * {k} for every {i} from 1 to n, n included."""\n'
              "    total = 0\n"
              f"    for {i} in range(1, n + 1):\n"
              f"        total += {i} * {k}\n"
              "    return total\n")
    return Variant("off_by_one_range", name, source, "range(1, n + 1)", "range(1, n)",
                   lambda r: (r.randint(0, 40),), lambda r: (r.randint(1, 40),))


def comparison_operator(rng: random.Random) -> Variant:
    above = rng.random() < 0.5
    name = rng.choice(["count_above", "how_many_over", "tally_greater"] if above
                      else ["count_below", "how_many_under", "tally_smaller"])
    op, word = (">", "greater") if above else ("<", "smaller")
    values, limit = rng.choice(["values", "numbers", "scores"]), rng.choice(["limit", "threshold", "bound"])
    source = (f"def {name}({values}, {limit}):\n"
              f'    """Count the {values} strictly {word} than {limit}."""\n'
              "    count = 0\n"
              f"    for value in {values}:\n"
              f"        if value {op} {limit}:\n"
              "            count += 1\n"
              "    return count\n")

    def edge(r: random.Random) -> tuple[Any, ...]:
        values = _ints(r, 0, 20)
        return values + [values[0]], values[0]

    return Variant("comparison_operator", name, source, f"value {op} {limit}", f"value {op}= {limit}",
                   lambda r: (_ints(r, 0, 20), r.randint(0, 20)), edge)


_PRODUCTS = (("price", "quantity", "cost", "the cost of quantity items at price each"),
             ("width", "height", "area", "the area of a width by height rectangle"),
             ("rate", "hours", "pay", "the pay for hours of work at rate per hour"))


def arithmetic_operator(rng: random.Random) -> Variant:
    a, b, noun, meaning = rng.choice(_PRODUCTS)
    name, k = rng.choice([f"total_{noun}", f"{noun}_with_fee", f"compute_{noun}"]), rng.randint(1, 9)
    source = (f"def {name}({a}, {b}):\n"
              f'    """Return {meaning}, plus {k}."""\n'
              f"    return {a} * {b} + {k}\n")
    pair = lambda r: (r.randint(3, 30), r.randint(3, 30))  # noqa: E731  (x * y == x + y only at 2, 2)
    return Variant("arithmetic_operator", name, source, f"{a} * {b}", f"{a} + {b}",
                   lambda r: (r.randint(0, 30), r.randint(0, 30)), pair)


def initial_value(rng: random.Random) -> Variant:
    if rng.random() < 0.5:
        name, k = rng.choice(["scaled_product", "product_times", "multiply_all"]), rng.randint(2, 9)
        result = rng.choice(["result", "product", "acc"])
        source = (f"def {name}(values):\n"
                  f'    """Return {k} times the product of the values ({k} for no values)."""\n'
                  f"    {result} = {k}\n"
                  "    for value in values:\n"
                  f"        {result} *= value\n"
                  f"    return {result}\n")
        return Variant("initial_value", name, source, f"{result} = {k}", f"{result} = 0",
                       lambda r: (_ints(r, 1, 9, 0, 4),), lambda r: (_ints(r, 1, 9, 1, 4),))
    name = rng.choice(["smallest", "minimum_of", "lowest_value"])
    values, best = rng.choice(["values", "numbers", "readings"]), rng.choice(["best", "lowest", "current"])
    source = (f"def {name}({values}):\n"
              f'    """Return the smallest of the {values} (a non-empty list)."""\n'
              f"    {best} = {values}[0]\n"
              f"    for value in {values}[1:]:\n"
              f"        if value < {best}:\n"
              f"            {best} = value\n"
              f"    return {best}\n")
    return Variant("initial_value", name, source, f"{best} = {values}[0]", f"{best} = 0",
                   lambda r: (_ints(r, -20, 20),), lambda r: (_ints(r, 1, 30),))


def accumulator_return(rng: random.Random) -> Variant:
    name, k = rng.choice(["padded_length", "total_width", "label_space"]), rng.randint(1, 5)
    word = rng.choice(["word", "label", "tag"])
    source = (f"def {name}({word}s):\n"
              f'    """Return the total length of the {word}s plus {k} per {word}."""\n'
              "    total = 0\n"
              f"    for {word} in {word}s:\n"
              f"        total += len({word}) + {k}\n"
              "    return total\n")
    words = lambda r, lo: [r.choice(_WORDS) for _ in range(r.randint(lo, 5))]  # noqa: E731
    return Variant("accumulator_return", name, source, "\n    return total", "\n        return total",
                   lambda r: (words(r, 0),), lambda r: (words(r, 2),))



def swapped_arguments(rng: random.Random) -> Variant:
    k = rng.randint(1, 9)
    if rng.random() < 0.5:
        helper, name = rng.choice(["power", "raise_to"]), rng.choice(["shifted_power", "power_plus"])
        source = (f"def {helper}(base, exponent):\n"
                  "    return base ** exponent\n\n\n"
                  f"def {name}(x, n):\n"
                  f'    """Return x raised to the power n, plus {k}."""\n'
                  f"    return {helper}(x, n) + {k}\n")
        return Variant("swapped_arguments", name, source, f"return {helper}(x, n)", f"return {helper}(n, x)",
                       lambda r: (r.randint(1, 6), r.randint(0, 4)), lambda r: (r.randint(5, 9), r.randint(0, 3)))
    helper, name = rng.choice(["difference", "minus"]), rng.choice(["margin", "lead_by"])
    source = (f"def {helper}(a, b):\n"
              "    return a - b\n\n\n"
              f"def {name}(score, rival):\n"
              f'    """Return how far score is ahead of rival, plus a bonus of {k}."""\n'
              f"    return {helper}(score, rival) + {k}\n")
    distinct = lambda r: (r.randint(11, 30), r.randint(0, 10))  # noqa: E731
    return Variant("swapped_arguments", name, source, f"return {helper}(score, rival)",
                   f"return {helper}(rival, score)",
                   lambda r: (r.randint(0, 30), r.randint(0, 30)), distinct)


def boolean_operator(rng: random.Random) -> Variant:
    low = rng.randint(0, 20)
    high = low + rng.randint(3, 20)
    name = rng.choice(["in_range", "within_bounds", "is_allowed"])
    source = (f"def {name}(x):\n"
              f'    """Return True when x is between {low} and {high}, both included."""\n'
              f"    return x >= {low} and x <= {high}\n")
    outside = lambda r: (r.choice([r.randint(low - 10, low - 1), r.randint(high + 1, high + 10)]),)  # noqa: E731
    return Variant("boolean_operator", name, source, f"{low} and x", f"{low} or x",
                   lambda r: (r.randint(low - 10, high + 10),), outside)


def negated_condition(rng: random.Random) -> Variant:
    k = rng.randint(2, 7)
    name = rng.choice(["multiples_only", "keep_divisible", "filter_multiples"])
    values = rng.choice(["values", "numbers", "items"])
    source = (f"def {name}({values}):\n"
              f'    """Return the {values} that are multiples of {k}, in their order."""\n'
              f"    return [value for value in {values} if value % {k} == 0]\n")
    return Variant("negated_condition", name, source, f"% {k} == 0", f"% {k} != 0",
                   lambda r: (_ints(r, 0, 40, 0, 6),), lambda r: (_ints(r, 0, 40, 1, 6),))


FAMILIES: dict[str, Callable[[random.Random], Variant]] = {
    f.__name__: f for f in (off_by_one_range, comparison_operator, arithmetic_operator, initial_value,
                            accumulator_return, swapped_arguments, boolean_operator, negated_condition)
}
