"""Code repair tasks: a small Python function with one bug, its visible tests, hidden tests.

Task ``i`` of a split is a pure function of ``(seed, split, i)``: a ``random.Random`` seeded
with a string draws a bug family (``code_repair_families``), a variant of it (function name
and constants), and the test cases; expected values come from running the correct source
here, in this process (it is the dataset's own code, never the model's). Each prompt is a
repository copy for the agent's sandbox and the tests that score it:

* ``metadata["files"]``: ``solution.py`` (the buggy function) and ``test_solution.py`` (the
  visible cases, run as ``python3 test_solution.py``: one line per failure, a
  ``passed/total`` summary, exit status 1 on any failure);
* ``ground_truth``: ``{"tests": [assert lines]}``, the ``code_exec`` reward's format: every
  visible case plus as many hidden ones again (one of them always exposes the bug), run
  after ``from solution import *`` in a fresh sandbox;
* ``metadata["demonstration"]``: the repair done with the ``bash`` tool of the ``tool_loop``
  agent, the way a warm start teaches it: ``cat solution.py``, rewrite the file with a
  here-document, run the tests, answer. The tool results in it are what the real commands
  print.

The splits are disjoint by construction: a function source (its family, name and constants)
belongs to ``heldout`` when its SHA-256 falls in the first ``heldout_share`` of the hash
range, else to ``train``; each split draws variants until one is its own. So no held-out
function is ever trained on, while both splits cover every family.

Test latency is real and long-tailed: a task has 2 to 5 visible cases (more hidden), and a
``stress_share`` of tasks checks every case again 3,000 to 500,000 times (log-uniform),
in the visible tests and in one hidden assert.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from loongsage.plugin import ConfigError, Prompt

from loongsage_agents.datasets.code_repair_families import FAMILIES, Variant
from loongsage_agents.datasets.params import CodeRepairParams

SPLITS = ("train", "heldout")
SOLUTION, TESTS = "solution.py", "test_solution.py"
_MAX_DRAWS = 1000  # variants drawn for one task before giving up on finding one of its split


def _check(params: CodeRepairParams) -> None:
    if params.size < 1:
        raise ConfigError("dataset.size", f"must be >= 1, got {params.size}")
    if params.split not in SPLITS:
        raise ConfigError("dataset.split", f"expected one of {list(SPLITS)}, got {params.split!r}")
    if not 0.0 < params.heldout_share < 1.0:
        raise ConfigError("dataset.heldout_share", f"must be in (0, 1), got {params.heldout_share}")
    unknown = [f for f in params.families if f not in FAMILIES]
    if unknown:
        raise ConfigError("dataset.families", f"unknown bug famil(ies) {unknown}; available: {sorted(FAMILIES)}")
    if not 1 <= params.min_tests <= params.max_tests:
        raise ConfigError("dataset.max_tests", f"need 1 <= min_tests <= max_tests, got "
                          f"{params.min_tests} and {params.max_tests}")
    if not 0.0 <= params.stress_share <= 1.0:
        raise ConfigError("dataset.stress_share", f"must be a share in [0, 1], got {params.stress_share}")


def split_of(source: str, heldout_share: float) -> str:
    """The split a function source belongs to: a fixed cut of its SHA-256."""
    position = int.from_bytes(hashlib.sha256(source.encode()).digest()[:8], "big") / 2.0 ** 64
    return "heldout" if position < heldout_share else "train"


def _call(source: str, function: str, args: tuple[Any, ...]) -> tuple[bool, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<code_repair {function}>", "exec"), namespace)  # the dataset's own code
    try:
        return True, namespace[function](*args)
    except Exception as err:  # a buggy version may raise; that also exposes the bug
        return False, repr(err)


def _call_text(function: str, args: tuple[Any, ...]) -> str:
    return f"{function}({', '.join(repr(a) for a in args)})"


class CodeRepairDataset:
    """Seeded one-bug Python functions to repair in a sandbox, scored by hidden tests."""

    format = "code_repair"

    def __init__(self, params: CodeRepairParams, seed: int = 0) -> None:
        _check(params)
        self.params = params
        self.seed = seed
        self.families = [FAMILIES[f] for f in (params.families or sorted(FAMILIES))]

    def __len__(self) -> int:
        return self.params.size

    def _variant(self, rng: random.Random) -> Variant:
        for _ in range(_MAX_DRAWS):
            variant = rng.choice(self.families)(rng)
            if split_of(variant.reference, self.params.heldout_share) == self.params.split:
                return variant
        raise ConfigError("dataset.families", f"no function of {self.params.families or 'any family'} "
                          f"falls in split {self.params.split!r} in {_MAX_DRAWS} draws")

    def _cases(self, variant: Variant, rng: random.Random, count: int) -> list[tuple[tuple, Any]]:
        """``count`` cases, the first one exposing the bug, each with the reference's result."""
        cases = []
        for i in range(count):
            args = variant.edge(rng) if i == 0 else variant.args(rng)
            ok, expected = _call(variant.reference, variant.function, args)
            if not ok:
                raise ValueError(f"code_repair family {variant.family!r}: the reference "
                                 f"{_call_text(variant.function, args)} raised {expected}")
            cases.append((args, expected))
        if _call(variant.buggy, variant.function, cases[0][0]) == (True, cases[0][1]):
            raise ValueError(f"code_repair family {variant.family!r}: its edge case "
                             f"{_call_text(variant.function, cases[0][0])} does not expose the bug")
        return cases

    def get(self, index: int) -> Prompt:
        """Task ``index`` of the split; the same ``(seed, split, index)`` always gives the same task."""
        p = self.params
        if not 0 <= index < p.size:
            raise IndexError(f"code_repair: index {index} out of range (0..{p.size - 1})")
        rng = random.Random(f"code_repair:{self.seed}:{p.split}:{index}")
        variant = self._variant(rng)
        visible_count = rng.randint(p.min_tests, p.max_tests)
        cases = self._cases(variant, rng, visible_count + rng.randint(visible_count, 2 * visible_count))
        visible = cases[:visible_count]
        rng.shuffle(visible)
        rounds = int(10 ** rng.uniform(3.5, 5.7)) if rng.random() < p.stress_share else 1
        fn = variant.function
        files = {SOLUTION: variant.buggy, TESTS: visible_test_file(fn, visible, rounds)}
        tests = [f"assert {_call_text(fn, args)} == {expected!r}" for args, expected in cases]
        if rounds > 1:
            args, expected = cases[0]
            tests.append(f"assert all({_call_text(fn, args)} == {expected!r} for _ in range({rounds}))")
        return Prompt(
            source=self.format, index=index,
            messages=[{"role": "user", "content": task_message(fn)}],
            ground_truth={"tests": tests},
            metadata={"files": files, "family": variant.family, "function": fn, "split": p.split,
                      "stress_rounds": rounds,
                      "demonstration": repair_demonstration(variant.buggy, variant.reference, len(visible))},
        )


def task_message(function: str) -> str:
    """The user turn of a task: what is in the working directory and what to do."""
    return (f"The working directory holds `{SOLUTION}`, which defines the function `{function}`, and "
            f"`{TESTS}`, its tests. `python3 {TESTS}` fails because `{function}` has a bug. Fix the "
            f"function in `{SOLUTION}` using the bash tool, run the tests, and when they pass, stop: "
            "answer without a tool call.")


def visible_test_file(function: str, cases: list[tuple[tuple, Any]], rounds: int) -> str:
    """``test_solution.py``: every case checked ``rounds`` times, failures listed, a summary."""
    listed = "".join(f"    ({args!r}, {expected!r}),\n" for args, expected in cases)
    return (f'"""Tests of {function} in {SOLUTION}; run them with: python3 {TESTS}"""\n'
            "import shutil\n"
            "import sys\n\n"
            "# solution.py is edited and re-run within seconds: a cached .pyc of the same size and\n"
            "# second would run the old code, so the module is compiled from source every time\n"
            "sys.dont_write_bytecode = True\n"
            'shutil.rmtree("__pycache__", ignore_errors=True)\n\n'
            f"from solution import {function}  # noqa: E402\n\n"
            f"CASES = [\n{listed}]\n"
            f"ROUNDS = {rounds}  # calls per case; every call must return the expected value\n\n\n"
            "def main():\n"
            "    failed = 0\n"
            "    for args, expected in CASES:\n"
            "        try:\n"
            f"            results = {{repr({function}(*args)) for _ in range(ROUNDS)}}\n"
            "        except Exception as err:\n"
            "            results = {'raised ' + repr(err)}\n"
            "        if results != {repr(expected)}:\n"
            "            failed += 1\n"
            f"            print(f'FAIL: {function}{{args!r}} returned {{\", \".join(sorted(results))}}, "
            "expected {expected!r}')\n"
            "    print(f'{len(CASES) - failed}/{len(CASES)} tests passed')\n"
            "    sys.exit(1 if failed else 0)\n\n\n"
            'if __name__ == "__main__":\n'
            "    main()\n")


def _bash_call(call_id: str, command: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})}}


def repair_demonstration(buggy: str, fixed: str, test_count: int) -> list[dict[str, Any]]:
    """Look at the file, write the fixed file, run the tests, answer (``bash`` tool calls)."""
    steps = [(f"cat {SOLUTION}", buggy.rstrip("\n")),
             (f"cat > {SOLUTION} << 'EOF'\n{fixed}EOF", ""),
             (f"python3 {TESTS}", f"{test_count}/{test_count} tests passed")]
    turns: list[dict[str, Any]] = []
    for i, (command, output) in enumerate(steps):
        turns += [{"role": "assistant", "content": "", "tool_calls": [_bash_call(f"call_{i}", command)]},
                  {"role": "tool", "tool_call_id": f"call_{i}", "content": output}]
    return turns + [{"role": "assistant", "content": f"Fixed: all {test_count} tests pass."}]
