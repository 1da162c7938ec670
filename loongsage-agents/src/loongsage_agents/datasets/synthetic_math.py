"""Synthetic arithmetic word problems: a verifiable task a tiny model can learn quickly.

Problem ``i`` is a pure function of ``(seed, i)`` (a ``random.Random`` seeded with a string,
which Python hashes with SHA-512, so it is stable across processes and platforms), so any
index can be regenerated after a resume without storing the dataset. Each problem adds or
subtracts ``num_operands`` integers in one of a few phrasings (bare expression, word
problem, imperative) and asks for the answer in ``\\boxed{}``. ``max_operand`` sets the
difficulty: 9 gives single-digit problems, 99 two-digit ones.

``metadata["solution"]`` holds a short worked answer ending in the boxed result, which the
SFT warm start can use as a target to teach the answer format. With ``tool_demonstrations``
> 0 that share of problems (chosen by its own seeded draw, so the problems themselves do not
change) carries a ``metadata["demonstration"]`` instead: an assistant turn that calls the
``calculator`` tool of the ``tool_loop`` agent with the expression, the tool's result, and
the boxed answer. A warm start on a mix of both teaches the tool-call format without
deciding for the model when to use it; RL has to find out that the tool pays.
"""

from __future__ import annotations

import json
import random

from loongsage.plugin import ConfigError, Prompt

from loongsage_agents.datasets.params import SyntheticMathParams

_NAMES = ("Ava", "Ben", "Chen", "Dana", "Eli", "Fatima", "Goro", "Hana", "Ivan", "Lin")
_OBJECTS = ("apples", "marbles", "books", "stickers", "coins", "pencils", "shells", "cards")
_PLAIN = ("What is {expr}?", "Compute {expr}.", "Calculate: {expr}")
_ADD_WORDS = (
    "{name} has {a} {obj} and gets {b} more. How many {obj} does {name} have now?",
    "Add {a} and {b}.",
    "There are {a} {obj} in a box and {b} {obj} on the table. How many {obj} are there in total?",
)
_SUB_WORDS = (
    "{name} has {a} {obj} and gives away {b}. How many {obj} does {name} have left?",
    "Subtract {b} from {a}.",
    "A shelf holds {a} {obj}. {name} takes {b} of them. How many {obj} are on the shelf now?",
)
_OPERATIONS = ("+", "-")


def _check(params: SyntheticMathParams) -> None:
    if params.size < 1:
        raise ConfigError("dataset.size", f"must be >= 1, got {params.size}")
    if params.max_operand < params.min_operand:
        raise ConfigError(
            "dataset.max_operand",
            f"{params.max_operand} is below dataset.min_operand={params.min_operand}",
        )
    if not 0.0 <= params.tool_demonstrations <= 1.0:
        raise ConfigError("dataset.tool_demonstrations",
                          f"must be a share in [0, 1], got {params.tool_demonstrations}")
    if params.min_operand < 0:
        raise ConfigError("dataset.min_operand", f"must be >= 0, got {params.min_operand}")
    if params.num_operands < 2:
        raise ConfigError("dataset.num_operands", f"must be >= 2, got {params.num_operands}")
    bad = [op for op in params.operations if op not in _OPERATIONS]
    if bad or not params.operations:
        raise ConfigError(
            "dataset.operations", f"expected a non-empty subset of {list(_OPERATIONS)}, got {list(params.operations)}"
        )


class SyntheticMathDataset:
    """Seeded addition/subtraction word problems whose answers go in \\boxed{}."""

    format = "synthetic_math"

    def __init__(self, params: SyntheticMathParams, seed: int = 0) -> None:
        _check(params)
        self.params = params
        self.seed = seed

    def __len__(self) -> int:
        return self.params.size

    def _terms(self, rng: random.Random) -> tuple[list[int], list[str], int]:
        p = self.params
        total = rng.randint(p.min_operand, p.max_operand)
        terms, ops = [total], []
        for _ in range(p.num_operands - 1):
            op = rng.choice(list(p.operations))
            high = p.max_operand if op == "+" or p.allow_negative else min(total, p.max_operand)
            if high < p.min_operand:  # cannot subtract without going negative: add instead
                op, high = "+", p.max_operand
            value = rng.randint(p.min_operand, high)
            total = total + value if op == "+" else total - value
            terms.append(value)
            ops.append(op)
        return terms, ops, total

    def get(self, index: int) -> Prompt:
        """Problem ``index``; the same ``(seed, index)`` always gives the same problem."""
        if not 0 <= index < self.params.size:
            raise IndexError(f"synthetic_math: index {index} out of range (0..{self.params.size - 1})")
        rng = random.Random(f"synthetic_math:{self.seed}:{index}")
        terms, ops, answer = self._terms(rng)
        expr = " ".join([str(terms[0])] + [f"{op} {t}" for op, t in zip(ops, terms[1:])])
        templates = list(_PLAIN)
        if len(terms) == 2:
            templates += _ADD_WORDS if ops[0] == "+" else _SUB_WORDS
        template = rng.choice(templates)
        question = template.format(
            expr=expr, a=terms[0], b=terms[-1], name=rng.choice(_NAMES), obj=rng.choice(_OBJECTS)
        )
        content = f"{question}\n{self.params.instruction}" if self.params.instruction else question
        solution = f"{expr} = {answer}. The answer is \\boxed{{{answer}}}."
        metadata = {"expression": expr, "solution": solution}
        demo_draw = random.Random(f"synthetic_math-demo:{self.seed}:{index}").random()
        if demo_draw < self.params.tool_demonstrations:
            metadata["demonstration"] = calculator_demonstration(expr, answer)
        return Prompt(
            source=self.format,
            index=index,
            messages=[{"role": "user", "content": content}],
            ground_truth=str(answer),
            metadata=metadata,
        )


def calculator_demonstration(expression: str, answer: int) -> list[dict]:
    """Call the calculator with ``expression``, read ``answer`` back, box it."""
    call = {"id": "call_0", "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})}}
    return [{"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": str(answer)},
            {"role": "assistant", "content": f"\\boxed{{{answer}}}"}]
