"""White-box agents (``chat``, ``tool_loop``) through a real router: the stored tokens are the
conversation, the loss mask is exactly the model's tokens, and rollout logprobs equal the train
engine's. Tool calls come from a scripted engine (the random tiny model never makes one); the
calculator runs in a real ``process`` sandbox, the one the data source names."""

from __future__ import annotations

import asyncio

import pytest

from loongsage import hookimpl
from loongsage.data.types import Prompt
from loongsage.engines.client import EngineClient
from loongsage.errors import ConfigError

from loongsage_agents.agents.chat import ChatAgent
from loongsage_agents.agents.router_params import ChatParams, ToolLoopParams
from loongsage_agents.agents.tool_loop import ToolLoopAgent

SAMPLING = {"max_new_tokens": 12, "temperature": 1.0}


def render(tokenizer, messages, generation=False, tools=None):
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                         add_generation_prompt=generation)


def test_chat_agent_samples_are_exact_tito_with_train_engine_logprobs(engine_url, tokenizer,
                                                                    agent_context, check_logprobs,
                                                                    long_context):
    agent = ChatAgent(ChatParams(max_context=long_context), agent_context())
    prompt = Prompt("demo", 3, [{"role": "system", "content": "Be terse."},
                                {"role": "user", "content": "What is 2 + 2?"}])
    try:
        samples = asyncio.run(agent.run_group(prompt, 2, EngineClient(engine_url), SAMPLING))
    finally:
        agent.close()
    assert len(samples) == 2
    assert len({s.reward_info["trajectory_id"] for s in samples}) == 2
    head = render(tokenizer, prompt.messages, generation=True)
    for s in samples:
        assert tokenizer.decode(s.prompt_ids) == head
        assert all(s.loss_mask) and 1 <= len(s.response_ids) <= SAMPLING["max_new_tokens"]
        assert tokenizer.decode(s.response_ids, skip_special_tokens=True) == s.text
    check_logprobs(samples)


def test_a_groups_trajectories_share_one_tls_context(engine_url, agent_context, long_context,
                                                    monkeypatch):
    """Each trajectory opens its own SDK client; the CA bundle is loaded once per process, not
    once per client (24 ms of CPU each on the rollout's critical path). The engine client's
    own HTTP pools (one per client and event loop) are not the agent's and are not counted."""
    import ssl
    import traceback

    from loongsage_agents.agents import chat

    built, real = [], ssl.create_default_context

    def counting(*args, **kwargs):
        if not any("loongsage/engines/client.py" in frame.filename for frame in traceback.extract_stack()):
            built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counting)
    chat.shared_tls_context.cache_clear()
    agent = ChatAgent(ChatParams(max_context=long_context), agent_context())
    prompt = Prompt("demo", 4, [{"role": "user", "content": "What is 1 + 1?"}])
    try:
        samples = asyncio.run(agent.run_group(prompt, 3, EngineClient(engine_url), SAMPLING))
    finally:
        agent.close()
        chat.shared_tls_context.cache_clear()
    assert len({s.reward_info["trajectory_id"] for s in samples}) == 3
    assert len(built) == 1


CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "(3 + 4) * 12"}}\n</tool_call>'
BAD = '<tool_call>\n{"name": "calculator", "arguments": {"expr": "1"}}\n</tool_call>'


class RecordingSandboxPlugin:
    """A sandbox backend only a run's own registries know (as a config-local ``plugins:``
    module's would be): the process backend, recording every command it runs."""

    commands: list = []

    @staticmethod
    @hookimpl
    def loongsage_register_sandboxes(register):
        from loongsage_sandbox.params import ProcessParams
        from loongsage_sandbox.process import ProcessSandbox

        class RecordingSandbox(ProcessSandbox):
            async def exec(self, command, **kwargs):
                RecordingSandboxPlugin.commands.append(command)
                return await super().exec(command, **kwargs)

        register("recording", RecordingSandbox, params=ProcessParams)


def test_tool_loop_runs_the_calculator_in_the_data_sources_sandbox(scripted_engine, tokenizer):
    """The sandbox named on the data source, from the run's registries (not the process-wide
    ones), is the one the agent's tool calls run in."""
    from loongsage.data.sources import SandboxFactory, SourceContext
    from loongsage.plugins import load_plugins

    registries = load_plugins(extra=[(RecordingSandboxPlugin, "recording-sandbox-plugin")])
    sandbox = registries.resolve("sandbox", {"type": "recording", "allow_untrusted_code": True},
                                 "data_sources[0].sandbox", "type")
    context = SourceContext("calc", "data_sources[0]", tokenizer, registries, SandboxFactory(sandbox))
    engine = scripted_engine([CALL, BAD, "It is 84."])
    RecordingSandboxPlugin.commands.clear()
    agent = ToolLoopAgent(ToolLoopParams(max_turns=5), context)
    prompt = Prompt("calc", 0, [{"role": "user", "content": "What is (3 + 4) * 12?"}])
    try:
        [sample] = asyncio.run(agent.run_group(prompt, 1, engine, {"max_new_tokens": 64}))
    finally:
        agent.close()
    info = sample.reward_info
    assert sample.text == "It is 84." and info["turns"] == 3 and info["tool_calls"] == 2
    tool_outputs = [m["content"] for m in info["messages"] if m["role"] == "tool"]
    assert tool_outputs[0].strip() == "84"
    assert tool_outputs[1].startswith("error: bad arguments for calculator: argument 'expression'")
    assert len(RecordingSandboxPlugin.commands) == 1  # the good call ran there; the bad one never ran
    # the stored tokens are the whole conversation, rendered by the model's own template, with
    # the assistant turns exactly as sampled (not re-serialised from the parsed tool calls)
    replies = iter([CALL, BAD, "It is 84."])
    as_sampled = [{"role": "assistant", "content": next(replies)} if m["role"] == "assistant" else m
                  for m in info["messages"]]
    tools = [t.schema() for t in agent.tools.values()]
    full = render(tokenizer, as_sampled, tools=tools)
    assert tokenizer.decode(sample.prompt_ids + sample.response_ids) + "\n" == full
    # the loss mask covers exactly the three scripted replies (each + its end-of-turn token)
    sampled = [t for t, m in zip(sample.response_ids, sample.loss_mask) if m]
    replies = [CALL, BAD, "It is 84."]
    assert sampled == [t for r in replies
                       for t in tokenizer.encode(r, add_special_tokens=False) + [engine.eos]]
    assert all(lp == engine.LOGPROB for lp, m in zip(sample.response_logprobs, sample.loss_mask) if m)


SLOW = '<tool_call>\n{"name": "bash", "arguments": {"command": "sleep 4325"}}\n</tool_call>'
ECHO = '<tool_call>\n{"name": "bash", "arguments": {"command": "echo again"}}\n</tool_call>'


def test_a_sandbox_supervisor_killed_mid_tool_call_is_an_error_the_model_sees(scripted_engine, tokenizer,
                                                                              agent_context):
    """The sandbox's supervisor is SIGKILLed while it runs the first call: that call's tool
    message is the error, the next call gets the error of a closed sandbox, the model's next turn
    is sampled with both in its prompt, and the trajectory ends normally, marked as failed
    (``rollout.failed_trajectory`` decides) with the sandbox's error; nothing it ran is left."""
    import os
    import signal
    import threading
    import time

    from loongsage_sandbox.testing import host_processes_with, supervisor_processes

    def kill_mid_exec() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            running = {pid: kids for pid, kids in supervisor_processes(os.getpid()).items() if kids}
            if running:
                os.kill(next(iter(running)), signal.SIGKILL)
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_mid_exec, daemon=True)
    killer.start()
    engine = scripted_engine([SLOW, ECHO, "Done."])
    agent = ToolLoopAgent(ToolLoopParams(max_turns=5, tools=["bash"], tool_timeout_s=60),
                          agent_context({"type": "process", "allow_untrusted_code": True}))
    prompt = Prompt("calc", 0, [{"role": "user", "content": "Wait, then echo."}])
    start = time.monotonic()
    try:
        [sample] = asyncio.run(agent.run_group(prompt, 1, engine, {"max_new_tokens": 64}))
    finally:
        agent.close()
    killer.join(timeout=1)
    assert time.monotonic() - start < 30  # the crash is seen at once, not after the tool's 60 s timeout
    info = sample.reward_info
    assert sample.text == "Done." and info["turns"] == 3 and info["tool_calls"] == 2
    crashed, closed = [m["content"] for m in info["messages"] if m["role"] == "tool"]
    assert crashed.startswith("error: bash did not run: process sandbox supervisor died while exec")
    assert closed == "error: bash did not run: process sandbox is closed"
    assert info["sandbox_failed"] is True and info["sandbox_error"] in crashed
    assert info["failed"] == f"its sandbox could not run a tool call: {info['sandbox_error']}"
    text = tokenizer.decode(sample.prompt_ids + sample.response_ids)
    assert crashed in text and closed in text  # the model was sampled after reading both
    assert host_processes_with("sleep 4325") == []


def test_tool_loop_refuses_unknown_tools_and_a_source_without_a_sandbox(agent_context):
    with pytest.raises(ValueError, match=r"agent.params.tools: unknown tool\(s\) \['web'\]"):
        ToolLoopAgent(ToolLoopParams(tools=["calculator", "web"]), agent_context({"type": "process", "allow_untrusted_code": True}))
    with pytest.raises(ConfigError, match=r"^data_sources\[0\]\.sandbox: agent 'tool_loop' runs commands"):
        ToolLoopAgent(ToolLoopParams(), agent_context())


def test_sft_demonstration_tokens_equal_the_rollout_of_the_same_conversation(scripted_engine,
                                                                             tokenizer, agent_context):
    """The warm start trains on exactly the tokens a rollout records: a synthetic_math tool
    demonstration, encoded by SFT, equals the router's trajectory when the engine samples the
    demonstration's assistant turns and the real calculator answers in a sandbox."""
    from loongsage.agentflow.tito import ChatRenderer
    from loongsage.controller.sft import Demonstration, encode_demonstration

    from loongsage_agents.datasets.params import SyntheticMathParams
    from loongsage_agents.datasets.synthetic_math import SyntheticMathDataset
    from loongsage_agents.tool_parsers.hermes import HermesToolParser

    data = SyntheticMathDataset(SyntheticMathParams(max_operand=999, tool_demonstrations=1.0))
    prompt = data.get(7)
    agent = ToolLoopAgent(ToolLoopParams(max_turns=3), agent_context({"type": "process", "allow_untrusted_code": True}))
    demo = Demonstration(prompt.messages, prompt.metadata["demonstration"], agent.tool_schemas(),
                         HermesToolParser())
    renderer, history, replies = ChatRenderer(tokenizer), list(demo.messages), []
    for message in demo.completion:
        if message["role"] == "assistant":
            replies.append(renderer.assistant_text(history, message, demo.tools, HermesToolParser()))
        history.append(message)
    try:
        [sample] = asyncio.run(agent.run_group(prompt, 1, scripted_engine(replies), {}))
    finally:
        agent.close()
    assert sample.reward_info["tool_calls"] == 1 and sample.text == f"\\boxed{{{prompt.ground_truth}}}"
    ids, mask = encode_demonstration(tokenizer, demo)
    assert sample.prompt_ids + sample.response_ids == ids
    assert [0] * len(sample.prompt_ids) + sample.loss_mask == mask
