"""Real agent CLIs (Codex, Claude Code, OpenCode), installed from npm into the LoongSage cache,
each completing a trivial task offline against a real router backed by the embedded engine
(tiny model, long-context view). For every trajectory: the stored tokens decode to the
conversation the CLI sent, the loss mask covers exactly the generated tokens, and rollout
logprobs equal the train engine's (fp32, 1e-5). Short system prompts and few tools keep the
prompts at 4–8 K tokens; max tokens are small so the random model's turns are short."""

from __future__ import annotations

import asyncio
import shutil
import time

import pytest

from loongsage.data.types import Prompt
from loongsage.engines.client import EngineClient

from loongsage_agents.agents.router_params import (ClaudeCodeParams, CodexParams,
                                                   MiniSweAgentParams, OpenCodeParams)
from loongsage_agents.launchers.claude_code import ClaudeCodeAgent
from loongsage_agents.launchers.cli import ensure_mini_swe_agent, ensure_npm_clis
from loongsage_agents.launchers.codex import CodexAgent
from loongsage_agents.launchers.mini_swe_agent import MiniSweAgent
from loongsage_agents.launchers.opencode import OpenCodeAgent

pytestmark = pytest.mark.slow

SHORT_PROMPT = "You are a coding agent. Answer briefly."
COMMON = {"timeout_s": 120, "default_max_tokens": 16, "max_output_tokens": 16}


@pytest.fixture(scope="module")
def bin_dir():
    if shutil.which("npm") is None:
        pytest.skip("npm (Node.js 20+) is not installed: the agent CLIs cannot be installed")
    started = time.monotonic()
    path = ensure_npm_clis()
    print(f"npm CLIs ready in {time.monotonic() - started:.1f} s")
    return str(path)


CASES = {
    "codex": (CodexAgent, lambda: CodexParams(instructions=SHORT_PROMPT, **COMMON)),
    "claude_code": (ClaudeCodeAgent, lambda: ClaudeCodeParams(system_prompt=SHORT_PROMPT, **COMMON)),
    "opencode": (OpenCodeAgent, lambda: OpenCodeParams(prompt=SHORT_PROMPT,
                                                       tools={"*": False, "bash": True}, **COMMON)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_cli_agent_trajectory_is_exact(name, bin_dir, recording_router, check_trajectories,
                                       long_context, tokenizer):
    cls, make_params = CASES[name]
    params = make_params()
    params.bin_dir, params.max_context = bin_dir, long_context
    agent = cls(params, tokenizer)
    recorder = recording_router(agent)
    prompt = Prompt(name, 0, [{"role": "user", "content": "Print the word hello."}])
    started = time.monotonic()
    samples = asyncio.run(agent.run_group(prompt, 1, EngineClient("http://unused"), {}))
    print(f"{name}: {time.monotonic() - started:.1f} s, {len(recorder.turns)} model calls, "
          f"{[len(s.prompt_ids) + len(s.response_ids) for s in samples]} tokens")
    info = samples[0].reward_info
    assert not info["timed_out"], info["stderr"][-2000:]
    assert all(s.reward_info["origin"] in ("root", "compact", "subagent") for s in samples)
    check_trajectories(samples, recorder)


# ---- mini-swe-agent (pip, in its own venv under the LoongSage cache) ------------------------

@pytest.fixture(scope="module")
def mini_bin_dir():
    started = time.monotonic()
    path = ensure_mini_swe_agent()
    print(f"mini-swe-agent ready in {time.monotonic() - started:.1f} s")
    return str(path)


def mini_agent(bin_dir: str, long_context: int, **overrides) -> MiniSweAgent:
    params = MiniSweAgentParams(**{**COMMON, "bin_dir": bin_dir, "max_context": long_context,
                                   **overrides})
    return MiniSweAgent(params, None)


def test_mini_swe_agent_trajectory_is_exact_and_forks_at_each_dropped_reply(
        mini_bin_dir, recording_router, check_trajectories, long_context, tokenizer):
    """The random tiny model never calls the bash tool, so mini drops each reply and answers
    with a "Tool call error" user turn: every request after the first shares no sampled turn
    with the stored one, so the router opens a fresh ``compact`` segment per call (tito.py:
    "with no shared turn it opens a fresh compact segment"). ``step_limit`` ends the run after
    exactly that many model calls (the format-error limit is off)."""
    agent = mini_agent(mini_bin_dir, long_context, step_limit=3, max_consecutive_format_errors=0)
    agent.tokenizer = tokenizer
    recorder = recording_router(agent)
    prompt = Prompt("mini", 0, [{"role": "user", "content": "Print the word hello."}])
    started = time.monotonic()
    samples = asyncio.run(agent.run_group(prompt, 1, EngineClient("http://unused"), {}))
    print(f"mini_swe_agent: {time.monotonic() - started:.1f} s, {len(recorder.turns)} model calls, "
          f"{[len(s.prompt_ids) + len(s.response_ids) for s in samples]} tokens")
    info = samples[0].reward_info
    assert not info["timed_out"] and info["exit_code"] == 0, info["stderr"][-2000:]
    assert info["mini_exit_status"] == "LimitsExceeded" and info["mini_api_calls"] == 3
    assert len(recorder.turns) == 3
    # each request: system, task, then one error turn per dropped reply (no assistant turn)
    for i, turn in enumerate(recorder.turns):
        roles = [m["role"] for m in turn["messages"]]
        assert roles == ["system", "user"] + ["user"] * i
        assert all(m["content"].startswith(("Your previous response", "Tool call error"))
                   for m in turn["messages"][2:])
        assert [t["function"]["name"] for t in turn["tools"]] == ["bash"]
    assert [(s.reward_info["origin"], s.reward_info["parent"]) for s in samples] == [
        ("root", None), ("compact", 0), ("compact", 1)]
    # every fresh segment renders the same system + task turns from scratch
    first = recorder.turns[0]
    head = tokenizer.encode(tokenizer.apply_chat_template(
        first["messages"], tools=first["tools"], tokenize=False), add_special_tokens=False)
    assert all(s.prompt_ids[:len(head)] == head for s in samples)
    check_trajectories(samples, recorder)
