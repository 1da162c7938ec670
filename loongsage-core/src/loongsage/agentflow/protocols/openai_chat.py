"""OpenAI Chat Completions (``/v1/chat/completions``): requests in, completions and chunks out.

OpenCode and mini-swe-agent speak it. ``n > 1`` is refused (one trajectory, one sample).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, AsyncIterator

from loongsage.agentflow.errors import RequestError
from loongsage.agentflow.messages import ChatRequest, SamplingOptions, content_text
from loongsage.agentflow.protocols.base import (
    StreamEvent, TurnResult, function_tool, get_field, openai_error, require_object, sse,
    stop_list,
)

ROLES = ("system", "developer", "user", "assistant", "tool")


def _tool_calls(m: dict[str, Any], i: int, where: str) -> list[dict[str, Any]]:
    calls = []
    for j, c in enumerate(m.get("tool_calls") or []):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f"{where}.tool_calls[{j}]: expected "
                               "{'function': {'name': ..., 'arguments': ...}}",
                               param=f"{where}.tool_calls")
        args = fn.get("arguments", "{}")
        args = args if isinstance(args, str) else json.dumps(args)
        calls.append({"id": c.get("id") or f"call_{i}_{j}", "type": "function",
                      "function": {"name": fn["name"], "arguments": args}})
    return calls


def _message(m: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise RequestError(f"{where}: expected an object", param=where)
    role = m.get("role")
    if role not in ROLES:
        raise RequestError(f"{where}.role: expected one of {ROLES}, got {role!r}",
                           param=f"{where}.role")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role,
                           "content": content_text(m.get("content"), f"{where}.content")}
    if role == "assistant":
        calls = _tool_calls(m, i, where)
        if calls:
            out["tool_calls"] = calls
        if m.get("reasoning_content"):
            out["reasoning_content"] = m["reasoning_content"]
    if role == "tool":
        out["tool_call_id"] = m.get("tool_call_id") or ""
    return out


def _tools(raw: list[Any]) -> list[dict[str, Any]]:
    tools = []
    for i, t in enumerate(raw):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict):
            raise RequestError(f"tools[{i}]: expected {{'type': 'function', 'function': {{...}}}}",
                               param="tools")
        tools.append(function_tool(fn.get("name"), fn.get("description"), fn.get("parameters"),
                                   f"tools[{i}]"))
    return tools


def _finish(result: TurnResult) -> str:
    return "tool_calls" if result.tool_calls else result.finish_reason


def _usage(result: TurnResult) -> dict[str, int]:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens}


class OpenAIChatAdapter:
    wire = "openai_chat"

    def parse_request(self, body: Any) -> ChatRequest:
        body = require_object(body, "chat.completions")
        n = get_field(body, "n", int, 1)
        if n != 1:
            raise RequestError(f"n: only n=1 is supported, got {n}", param="n")
        messages = get_field(body, "messages", list, required=True)
        max_tokens = get_field(body, "max_completion_tokens", int)
        if max_tokens is None:
            max_tokens = get_field(body, "max_tokens", int)
        sampling = SamplingOptions(
            max_tokens=max_tokens,
            temperature=float(get_field(body, "temperature", (int, float), 1.0)),
            top_p=float(get_field(body, "top_p", (int, float), 1.0)),
            stop=stop_list(body.get("stop"), "stop"), seed=get_field(body, "seed", int))
        stream_opts = get_field(body, "stream_options", dict, {})
        return ChatRequest(wire=self.wire, model=get_field(body, "model", str, required=True),
                           messages=[_message(m, i) for i, m in enumerate(messages)],
                           tools=_tools(get_field(body, "tools", list, [])), sampling=sampling,
                           stream=bool(get_field(body, "stream", bool, False)),
                           include_usage=bool(stream_opts.get("include_usage")), raw=body)

    def render_response(self, request: ChatRequest, result: TurnResult) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": result.content}
        if result.tool_calls:
            message["tool_calls"] = [c.to_openai() for c in result.tool_calls]
        return {"id": f"chatcmpl-{result.response_id}", "object": "chat.completion",
                "created": result.created, "model": request.model,
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": _finish(result)}],
                "usage": _usage(result)}

    async def stream_response(self, request: ChatRequest,
                              events: AsyncIterator[StreamEvent]) -> AsyncIterator[str]:
        head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": request.model}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            return sse({**head, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                             "finish_reason": finish}]})

        yield chunk({"role": "assistant", "content": ""})
        async for ev in events:
            if ev.text:
                yield chunk({"content": ev.text})
            if ev.result is not None:
                for i, call in enumerate(ev.result.tool_calls):
                    yield chunk({"tool_calls": [{"index": i, **call.to_openai()}]})
                yield chunk({}, _finish(ev.result))
                if request.include_usage:
                    yield sse({**head, "choices": [], "usage": _usage(ev.result)})
        yield sse("[DONE]")

    def render_error(self, error: RequestError) -> dict[str, Any]:
        return openai_error(error)
