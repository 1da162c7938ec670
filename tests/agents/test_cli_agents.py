"""Real agent CLIs (Codex, Claude Code, OpenCode), installed from npm into the LoongSage cache,
each completing a trivial task offline against a real router backed by the embedded engine
(tiny model, long-context view). For every trajectory: the stored tokens decode to the
conversation the CLI sent, the loss mask covers exactly the generated tokens, and rollout
logprobs equal the train engine's (fp32, 1e-5). Short system prompts and few tools keep the
prompts at 4–8 K tokens; max tokens are small so the random model's turns are short."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import pytest

from loongsage.data.sources import SourceContext
from loongsage.data.types import Prompt
from loongsage.engines.client import EngineClient
from loongsage.plugins import get_registries

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
                                       long_context, agent_context):
    cls, make_params = CASES[name]
    params = make_params()
    params.bin_dir, params.max_context = bin_dir, long_context
    agent = cls(params, agent_context())
    recorder = recording_router(agent)
    prompt = Prompt(name, 0, [{"role": "user", "content": "Print the word hello."}])
    started = time.monotonic()
    samples = asyncio.run(agent.run_group(prompt, 1, EngineClient("http://unused"), {"sampling_seed": 7}))
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


def no_tokenizer_context() -> SourceContext:
    """mini-swe-agent never tokenizes: the router it is handed does."""
    return SourceContext("mini", "data_sources[0]", None, get_registries())


def mini_agent(bin_dir: str, long_context: int, **overrides) -> MiniSweAgent:
    params = MiniSweAgentParams(**{**COMMON, "bin_dir": bin_dir, "max_context": long_context,
                                   **overrides})
    return MiniSweAgent(params, no_tokenizer_context())


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
    samples = asyncio.run(agent.run_group(prompt, 1, EngineClient("http://unused"), {"sampling_seed": 7}))
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


TOUCH = '<tool_call>\n{"name": "bash", "arguments": {"command": "printf hello > out.txt"}}\n</tool_call>'
IDLE = "The file is written."  # no tool call: mini drops this reply from its history
SUBMIT = ('<tool_call>\n{"name": "bash", "arguments": {"command": '
          '"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat out.txt"}}\n</tool_call>')


def test_mini_swe_agent_completes_a_file_task_and_forks_after_a_dropped_reply(
        mini_bin_dir, recording_router, scripted_engine, long_context, tokenizer, tmp_path):
    """A real task end to end: mini runs a bash tool call that writes ``out.txt`` in the
    trajectory's work dir, then a reply without a tool call (dropped by mini, answered with a
    "Tool call error" user turn), then submits with the file's content. The replies come from
    ``ScriptedEngine`` (the random tiny model never calls a tool, so its logprobs are fixed,
    not the train engine's); router, mini and its shell are real. The dropped reply makes the
    router fork where both histories stop agreeing: a ``compact`` segment whose first tokens
    are the root's up to the end of the tool result, held once (tito.py)."""
    from loongsage.agentflow.messages import template_messages

    engine = scripted_engine([TOUCH, IDLE, SUBMIT])
    agent = mini_agent(mini_bin_dir, long_context, step_limit=5, workdir_root=str(tmp_path),
                       keep_workdir=True)
    agent.tokenizer = tokenizer
    recorder = recording_router(agent, engine, tmp_path / "run")
    task = "-Write hello into out.txt."  # a leading '-' must not read as an option
    prompt = Prompt("mini", 1, [{"role": "user", "content": task}])
    samples = asyncio.run(agent.run_group(prompt, 1, engine, {}))
    info = samples[0].reward_info
    assert info["exit_code"] == 0 and info["mini_exit_status"] == "Submitted", info["stdout"][-3000:]
    assert info["mini_api_calls"] == 3 and len(recorder.turns) == 3
    assert (Path(info["workdir"]) / "out.txt").read_text() == "hello"
    assert all(s.text == "hello" for s in samples)  # the submission: output after the marker
    assert [[m["role"] for m in t["messages"]] for t in recorder.turns] == [
        ["system", "user"], ["system", "user", "assistant", "tool"],
        ["system", "user", "assistant", "tool", "user"]]
    assert recorder.turns[2]["messages"][4]["content"].startswith("Tool call error")
    assert task in recorder.turns[0]["messages"][1]["content"]
    root, fork = samples
    assert (root.reward_info["origin"], root.reward_info["parent"]) == ("root", None)
    assert (fork.reward_info["origin"], fork.reward_info["parent"]) == ("compact", 0)

    def sampled(s):
        return [t for t, m in zip(s.response_ids, s.loss_mask) if m]

    def reply(text):
        return tokenizer.encode(text, add_special_tokens=False) + [engine.eos]

    assert sampled(root) == reply(TOUCH) + reply(IDLE) and sampled(fork) == reply(SUBMIT)
    assert all(lp == engine.LOGPROB for s in samples
               for lp, m in zip(s.response_logprobs, s.loss_mask) if m)
    # the fork shares the root's tokens through the end of the tool result (the messages both
    # histories hold, past the first reply), then holds only the error turn
    root_ids, fork_ids = root.prompt_ids + root.response_ids, fork.prompt_ids + fork.response_ids
    both = recorder.turns[1]
    shared = len(tokenizer.encode(tokenizer.apply_chat_template(
        template_messages(both["messages"]), tools=both["tools"], tokenize=False),
        add_special_tokens=False))
    assert shared > len(root.prompt_ids) + len(reply(TOUCH))
    assert fork_ids[:shared] == root_ids[:shared]
    # ... by reference: the persisted trajectory holds those tokens once
    [stored] = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").open()]
    fork_seg = stored["segments"][1]
    assert fork_seg["shared_len"] == shared and fork_seg["spans"][0] == [0, shared]
    assert len(stored["tokens"]) == len(root_ids) + len(fork_ids) - shared
    assert tokenizer.decode(root_ids[shared:]) == "<|im_start|>assistant\n" + IDLE + "<|im_end|>"
    tail = tokenizer.decode(fork_ids[shared:len(fork.prompt_ids)])
    assert tail.startswith("<|im_start|>user\nTool call error") and "<tool_response>" not in tail
    # each sample's tokens before its last reply decode to the request that produced it
    for s, turn in ((root, recorder.turns[1]), (fork, recorder.turns[2])):
        ids = s.prompt_ids + s.response_ids
        start = len(ids) - len(reply(IDLE if s is root else SUBMIT))
        assert turn["prompt_tokens"] == start
        assert tokenizer.decode(ids[:start]) == tokenizer.apply_chat_template(
            template_messages(turn["messages"]), tools=turn["tools"], tokenize=False,
            add_generation_prompt=True)


def test_mini_swe_agent_refuses_what_would_break_its_run(tmp_path, monkeypatch):
    """Bad parameters fail before mini starts, naming the field; a missing ``mini`` names how
    to install it (its own venv in the cache)."""
    urls = {"openai": "http://127.0.0.1:1/t/0/v1", "anthropic": "http://127.0.0.1:1/t/0"}
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    bad = {"step_limit": 0, "files": {"mini.yaml": "agent: {}"}}
    for field, value in bad.items():
        agent = MiniSweAgent(MiniSweAgentParams(**{field: value}), no_tokenizer_context())
        with pytest.raises(ValueError, match=f"agent.params.{field}"):
            agent.prepare("task", urls, "t:0", work, home)
    monkeypatch.setenv("LOONGSAGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"venvs/mini-swe-agent/bin/pip install "
                                                r"mini-swe-agent==2\.4\.6"):
        MiniSweAgent(MiniSweAgentParams(), no_tokenizer_context()).prepare("task", urls, "t:0", work, home)
