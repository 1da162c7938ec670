"""Wire adapters on request bodies shaped like the real agents' (docs/agents.md records each agent's
wire behaviour)."""

from __future__ import annotations

import pytest

from loongsage.agentflow.errors import RequestError
from loongsage.agentflow.messages import canonical
from loongsage.agentflow.protocols import AnthropicMessagesAdapter, OpenAIChatAdapter, OpenAIResponsesAdapter
from loongsage.agentflow.protocols.base import TurnResult
from loongsage.agentflow.tool_calls import ToolCall

EXEC = {"type": "function", "name": "exec_command", "description": "run", "strict": False,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}


def codex_body(extra_items=()):
    return {"model": "policy", "stream": True, "store": False, "parallel_tool_calls": False,
            "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "abc", "tool_choice": "auto",
            "tools": [EXEC, {"type": "namespace", "name": "mcp", "tools": []}, {"type": "web_search"}],
            "input": [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "SYS"}]},
                      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<env/>"}]},
                      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list"}]},
                      *extra_items]}


def test_codex_turn_two_echo_matches_turn_one_semantically():
    adapter = OpenAIResponsesAdapter()
    first = adapter.parse_request(codex_body())
    assert [m["role"] for m in first.messages] == ["system", "user", "user"]
    assert [t["function"]["name"] for t in first.tools] == ["exec_command"]  # hosted tools left out
    echo = [{"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
            {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "Listing.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "exec_command",
             "arguments": '{ "cmd" : "ls" }'},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"}]
    second = adapter.parse_request(codex_body(echo))
    assistant, tool = second.messages[3], second.messages[4]
    assert assistant["content"] == "Listing." and assistant["tool_calls"][0]["function"]["name"] == "exec_command"
    ours = {"role": "assistant", "content": "Listing.",
            "tool_calls": [ToolCall("exec_command", '{"cmd":"ls"}', "other").to_openai()]}
    assert canonical(assistant) == canonical(ours)  # key spacing and call ids do not matter
    assert tool == {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}


def test_claude_code_body_with_mid_conversation_system_and_thinking():
    body = {"model": "policy", "max_tokens": 32000, "stream": True, "thinking": {"type": "adaptive"},
            "metadata": {"user_id": "u"}, "context_management": {}, "output_config": {},
            "system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B", "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "Bash", "description": "shell", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "task"}]},
                {"role": "system", "content": "reminder"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "sig"},
                                                  {"type": "text", "text": "I'll run it."},
                                                  {"type": "tool_use", "id": "tu1", "name": "Bash", "input": {"command": "ls"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1",
                                              "content": [{"type": "text", "text": "a.txt"}],
                                              "cache_control": {"type": "ephemeral"}}]}]}
    req = AnthropicMessagesAdapter().parse_request(body)
    assert [m["role"] for m in req.messages] == ["system", "user", "system", "assistant", "tool"]
    assert req.messages[0]["content"] == "AB" and req.sampling.max_tokens == 32000
    assert req.messages[3]["tool_calls"][0]["function"] == {"name": "Bash", "arguments": '{"command":"ls"}'}
    assert req.messages[4] == {"role": "tool", "tool_call_id": "tu1", "content": "a.txt"}
    assert req.stream and req.tools[0]["function"]["parameters"] == {"type": "object"}


def test_opencode_chat_body_keeps_reasoning_out_of_matching():
    req = OpenAIChatAdapter().parse_request({
        "model": "policy", "max_tokens": 8192, "stream": True, "stream_options": {"include_usage": True},
        "tool_choice": "auto",
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": "ok", "reasoning_content": "think",
                      "tool_calls": [{"id": "x", "type": "function",
                                      "function": {"name": "bash", "arguments": '{"command":"ls"}'}}]}]})
    assert req.include_usage and req.sampling.max_tokens == 8192
    without = dict(req.messages[1])
    without.pop("reasoning_content")
    assert canonical(req.messages[1]) == canonical(without)


@pytest.mark.parametrize("adapter,body,match", [
    (OpenAIChatAdapter(), {"model": "p"}, "messages: required field is missing"),
    (OpenAIChatAdapter(), {"model": "p", "messages": [{"role": "robot", "content": "x"}]}, r"messages\[0\].role"),
    (OpenAIChatAdapter(), {"model": "p", "messages": [], "temperature": "hot"}, "temperature: expected int or float"),
    (OpenAIResponsesAdapter(), {"model": "p", "input": 3}, "input: expected a string or a list"),
    (OpenAIResponsesAdapter(), {"model": "p", "input": "x", "previous_response_id": "r"}, "previous_response_id"),
    (OpenAIResponsesAdapter(), {"model": "p", "input": [{"type": "computer_call"}]}, r"input\[0\].type"),
    (AnthropicMessagesAdapter(), {"model": "p", "messages": [{"role": "user", "content": 5}]}, r"messages\[0\].content"),
    (AnthropicMessagesAdapter(), [1, 2], "request body must be a JSON object"),
])
def test_bad_requests_name_the_field(adapter, body, match):
    with pytest.raises(RequestError, match=match):
        adapter.parse_request(body)


def test_renderings_carry_tool_calls_in_each_format():
    call = ToolCall("ls", '{"path":"."}', "call_1")
    result = TurnResult(content="Looking.", tool_calls=[call], prompt_tokens=10, completion_tokens=5)
    chat = OpenAIChatAdapter()
    out = chat.render_response(chat.parse_request({"model": "p", "messages": [{"role": "user", "content": "x"}]}), result)
    assert out["choices"][0]["finish_reason"] == "tool_calls"
    assert out["choices"][0]["message"]["tool_calls"][0]["function"] == {"name": "ls", "arguments": '{"path":"."}'}
    resp = OpenAIResponsesAdapter()
    out = resp.render_response(resp.parse_request({"model": "p", "input": "x"}), result)
    assert [o["type"] for o in out["output"]] == ["message", "function_call"] and out["output"][1]["call_id"] == "call_1"
    msgs = AnthropicMessagesAdapter()
    out = msgs.render_response(msgs.parse_request({"model": "p", "max_tokens": 5, "messages": [
        {"role": "user", "content": "x"}]}), result)
    assert out["stop_reason"] == "tool_use" and out["content"][1]["input"] == {"path": "."}
    assert out["usage"] == {"input_tokens": 10, "output_tokens": 5}
