"""Code-execution reward: run a task's tests against the sample's code inside a sandbox.

The code is the last fenced block of the sample (```` ```python ```` preferred, any fence
otherwise). The tests run in the data source's sandbox (``data_sources[i].sandbox``), which
the controller hands the reward as ``context["sandbox"]`` (a factory of unstarted
sandboxes), never by importing loongsage-sandbox, so any installed backend (``bwrap``,
``remote``, ``docker``, or one from a config-local plugin module) works; the reward always
asks for an *untrusted* sandbox, so the ``process`` backend refuses unless the source sets
``sandbox: {type: process, allow_untrusted_code: true}``.

``ground_truth`` is one of

* ``{"inputs": [...], "outputs": [...]}``: stdin/stdout cases (competitive programming,
  as in APPS/CodeContests); one process per case, outputs compared after stripping
  trailing whitespace per line;
* ``{"tests": ["assert f(1) == 2", ...]}`` or a string of test code: assert-style tests
  (HumanEval/MBPP). They run in one process after ``from solution import *``; the
  harness is fed on stdin (not written to a file) and counts only if it reaches its
  end-of-run line, which carries a random nonce, so a solution that calls ``sys.exit(0)``
  or ``os._exit(0)`` at import scores zero rather than full marks. (A solution that
  introspects the harness's stack frames could still find the nonce; stdin/stdout cases
  are the format a solution cannot game.)

The result is a dict ``{"score", "passed", "total", "has_code", "timed_out", "error"}``;
``score`` is the pass fraction with ``partial_credit``, else 1.0 only when all pass.
``exec_timeout_s`` limits each command in the sandbox; the whole call, every case
included, runs under the data source's ``reward.timeout_s`` (default 30 s) in a reward
worker process, so a task with many stdin/stdout cases needs that raised to
``cases x exec_timeout_s`` plus the sandbox's start-up.
``code_exec_reward_async`` is the native coroutine; ``code_exec_reward`` is the plain
callable of the reward contract (it runs the coroutine on a private event loop).
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import threading
from dataclasses import dataclass, fields
from typing import Any, Mapping

from loongsage.plugin import ConfigError

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


@dataclass
class CodeExecParams:
    """Code execution reward: run the task's tests on the sample's last code block in a sandbox."""

    exec_timeout_s: float = 10.0  # per exec: the whole assert suite, or one stdin/stdout case
    partial_credit: bool = False  # score = passed / total instead of all-or-nothing
    no_code_score: float = 0.0  # no fenced code block in the sample
    python: str = "python3"  # interpreter inside the sandbox


def extract_code(text: str) -> str | None:
    """The last ```python (or ```py) block, else the last fenced block of any language."""
    blocks = _FENCE.findall(text or "")
    if not blocks:
        return None
    python = [code for lang, code in blocks if lang.lower() in ("python", "py", "python3")]
    return (python or [code for _, code in blocks])[-1]


def _coerce(params: Any) -> CodeExecParams:
    if params is None:
        return CodeExecParams()
    if isinstance(params, CodeExecParams):
        return params
    if isinstance(params, Mapping):
        names = {f.name for f in fields(CodeExecParams)}
        unknown = sorted(set(params) - names)
        if unknown:
            raise ConfigError(f"reward.{unknown[0]}", f"unknown parameter of code_exec; expected one of {sorted(names)}")
        return CodeExecParams(**params)
    raise TypeError(f"code_exec params must be a mapping or CodeExecParams, got {type(params).__name__}")


def _harness(tests: list[str], nonce: str) -> str:
    return (
        "import json, sys, traceback\n"
        "try:\n    from solution import *\nexcept BaseException:\n"
        "    traceback.print_exc(); print(json.dumps({'import_failed': True})); raise SystemExit(2)\n"
        f"TESTS = {json.dumps(tests)}\n"
        "passed = 0\n"
        "for src in TESTS:\n"
        "    try:\n        exec(compile(src, '<test>', 'exec'), globals())\n        passed += 1\n"
        "    except BaseException as err:\n        print('FAILED:', src[:200], '->', repr(err)[:200], file=sys.stderr)\n"
        f"print('{nonce}', passed, flush=True)\n"
    )


def _split_tests(ground_truth: Any) -> tuple[str, Any]:
    if isinstance(ground_truth, str):
        return "asserts", [ground_truth]
    if isinstance(ground_truth, Mapping):
        if "inputs" in ground_truth or "outputs" in ground_truth:
            inputs, outputs = list(ground_truth.get("inputs") or []), list(ground_truth.get("outputs") or [])
            if len(inputs) != len(outputs) or not inputs:
                raise ValueError(f"ground_truth: 'inputs' and 'outputs' must be non-empty lists of equal "
                                 f"length, got {len(inputs)} and {len(outputs)}")
            return "io", list(zip(inputs, outputs))
        tests = ground_truth.get("tests")
        if isinstance(tests, str):
            return "asserts", [tests]
        if isinstance(tests, list) and tests and all(isinstance(t, str) for t in tests):
            return "asserts", tests
    raise ValueError("ground_truth: expected test code (str), {'tests': [str, ...]} or "
                     f"{{'inputs': [...], 'outputs': [...]}}, got {type(ground_truth).__name__}")


def _same_output(got: str, want: Any) -> bool:
    norm = lambda s: "\n".join(line.rstrip() for line in str(s).strip().splitlines())  # noqa: E731
    return norm(got) == norm(want)


async def _run_tests(sb: Any, p: CodeExecParams, code: str, kind: str, cases: Any) -> dict[str, Any]:
    await sb.write_file("solution.py", code)
    if kind == "io":
        passed, timed_out = 0, False
        for stdin, expected in cases:
            r = await sb.exec([p.python, "solution.py"], stdin=str(stdin), timeout=p.exec_timeout_s)
            timed_out |= r.timed_out
            passed += int(r.exit_code == 0 and _same_output(r.text, expected))
        return {"passed": passed, "total": len(cases), "timed_out": timed_out, "error": None}
    nonce = secrets.token_hex(16)
    # the harness arrives on stdin, never as a file: the solution cannot read the nonce from disk
    r = await sb.exec([p.python, "-"], stdin=_harness(cases, nonce), timeout=p.exec_timeout_s)
    last = r.text.strip().splitlines()[-1:] or [""]
    head, _, count = last[0].partition(" ")
    passed = int(count) if head == nonce and count.isdigit() and r.exit_code == 0 else 0
    error = None if head == nonce else (r.stderr.decode(errors="replace")[-500:] or "tests did not finish")
    return {"passed": passed, "total": len(cases), "timed_out": r.timed_out, "error": error}


async def code_exec_reward_async(sample_text: str, ground_truth: Any, params: Any = None,
                                 **context: Any) -> dict[str, Any]:
    """Async form of the reward; ``context["sandbox"]`` is the data source's sandbox factory."""
    p = _coerce(params)
    kind, cases = _split_tests(ground_truth)
    code = extract_code(sample_text)
    if code is None:
        return {"score": p.no_code_score, "passed": 0, "total": len(cases), "has_code": False,
                "timed_out": False, "error": "no fenced code block"}
    factory = context.get("sandbox")
    if factory is None:
        raise ConfigError("data_sources[*].sandbox", "the code_exec reward runs the tests in the data "
                          "source's sandbox: name one, e.g. sandbox: {type: bwrap}")
    async with factory() as sb:
        result = await _run_tests(sb, p, code, kind, cases)
    total = result["total"]
    score = result["passed"] / total if p.partial_credit else float(result["passed"] == total)
    return {"score": score, "has_code": True, **result}


def code_exec_reward(sample_text: str, ground_truth: Any, params: Any = None, **context: Any) -> dict[str, Any]:
    """Run the task's tests on the sample's last code block in a sandbox; dict with ``score``."""
    coro = code_exec_reward_async(sample_text, ground_truth, params, **context)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def worker() -> None:  # called from inside an event loop: run on a private one
        try:
            box["result"] = asyncio.run(coro)
        except BaseException as err:  # re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=worker, name="code-exec-reward")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


# Async callers (rollout workers on an event loop) should await this instead of calling the
# sync form, which would block their loop while the tests run.
code_exec_reward.async_impl = code_exec_reward_async  # type: ignore[attr-defined]
