"""The code-execution reward, resolved by name, running the tests in the data source's sandbox
(real bwrap, else process)."""

from __future__ import annotations

import asyncio

import pytest

from loongsage.plugin import SandboxFactory
from loongsage.plugin import ConfigError, LoongSageError
from loongsage.plugin.testing import installed_registries

sandbox_testing = pytest.importorskip("loongsage_sandbox.testing", reason="needs loongsage-sandbox")
SANDBOX = "bwrap" if sandbox_testing.bwrap_unavailable_reason() is None else "process"
PARAMS = {"exec_timeout_s": 5}
SOURCE_SANDBOX = {"type": SANDBOX, **({} if SANDBOX == "bwrap" else {"allow_untrusted_code": True})}
ADD = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\n"
WRONG = "```python\ndef add(a, b):\n    return a - b\n```"
IO_SOLUTION = "```py\nimport sys\nnums = list(map(int, sys.stdin.read().split()))\nprint(sum(nums))\n```"


def sandbox(**limits):
    """The data source's sandbox, as the controller hands it to the reward."""
    node = {**SOURCE_SANDBOX, **limits}
    return SandboxFactory(installed_registries().resolve("sandbox", node, "data_sources[0].sandbox", "type"))


def reward():
    """The registered reward, called as the controller calls it: with the source's sandbox."""
    fn = installed_registries().reward.get("code_exec")

    def call(text, ground_truth, params, **context):
        return fn(text, ground_truth, params, **{"sandbox": sandbox(), **context})

    call.async_impl = fn.async_impl
    return call


def test_asserts_pass_fail_and_partial_credit():
    gt = {"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]}
    ok = reward()(ADD, gt, PARAMS)
    bad = reward()(WRONG, gt, PARAMS)  # a - b fails all three
    partial = reward()(WRONG, {"tests": ["assert add(2, 0) == 2", "assert add(1, 1) == 2"]},
                       {**PARAMS, "partial_credit": True})
    assert (ok["score"], ok["passed"], ok["total"], ok["error"]) == (1.0, 3, 3, None)
    assert (bad["score"], bad["passed"]) == (0.0, 0)
    assert (partial["score"], partial["passed"], partial["total"]) == (0.5, 1, 2)


def test_stdin_stdout_cases():
    gt = {"inputs": ["1 2\n", "10 20 30\n", "5\n"], "outputs": ["3", "60\n", "6"]}
    out = reward()(IO_SOLUTION, gt, {**PARAMS, "partial_credit": True})
    assert (out["passed"], out["total"]) == (2, 3)
    assert out["score"] == pytest.approx(2 / 3)


def test_exit_hacks_and_missing_code_score_zero():
    gt = {"tests": ["assert add(1, 2) == 3"]}
    for hack in ("import sys\nsys.exit(0)", "import os\nos._exit(0)",
                 "print(open('run_tests.py').read())\ndef add(a, b): return a + b\nimport sys; sys.exit(0)"):
        out = reward()(f"```python\n{hack}\n```", gt, PARAMS)
        assert out["score"] == 0.0 and out["passed"] == 0, hack
    none = reward()("I think the answer is add(a, b) = a + b", gt, {**PARAMS, "no_code_score": -0.5})
    assert (none["score"], none["has_code"]) == (-0.5, False)


def test_runaway_code_is_contained_and_reported():
    out = reward()("```python\nwhile True:\n    pass\n```", {"inputs": ["x"], "outputs": ["y"]},
                   {**PARAMS, "exec_timeout_s": 1}, sandbox=sandbox(cpu_time_s=5))
    assert out["score"] == 0.0 and out["timed_out"] is True


def test_async_form_inside_a_running_loop_and_bad_input():
    from loongsage_agents.rewards.code_exec import code_exec_reward_async

    async def go():
        native = await code_exec_reward_async(ADD, "assert add(2, 3) == 5", PARAMS, sandbox=sandbox())
        wrapped = reward()(ADD, "assert add(2, 3) == 5", PARAMS)  # sync form, called from a loop
        return native, wrapped

    native, wrapped = asyncio.run(go())
    assert native["score"] == wrapped["score"] == 1.0
    assert reward().async_impl is code_exec_reward_async  # found through the registry, no import
    with pytest.raises(ValueError, match="ground_truth"):
        reward()(ADD, {"inputs": ["1"], "outputs": []}, PARAMS)
    with pytest.raises(ConfigError, match="reward.sandbox_parms"):
        reward()(ADD, "assert True", {"sandbox_parms": {}})
    with pytest.raises(ConfigError, match=r"data_sources\[\*\]\.sandbox: the code_exec reward runs the tests"):
        installed_registries().reward.get("code_exec")(ADD, "assert True", PARAMS)


def test_process_sandbox_is_refused_for_model_code_unless_allowed():
    process = SandboxFactory(installed_registries().resolve("sandbox", "process", "data_sources[0].sandbox", "type"))
    with pytest.raises(LoongSageError, match="not a security boundary and refuses untrusted code"):
        reward()(ADD, "assert True", PARAMS, sandbox=process)
