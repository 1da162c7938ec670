"""Anthropic Messages (``/v1/messages``), what Claude Code speaks.

Content blocks become internal messages: ``tool_use`` → assistant ``tool_calls`` (input as
compact JSON), ``tool_result`` → one ``role: tool`` message each (placed before the user
text of the same message), ``thinking``/``redacted_thinking`` dropped. ``role: system``
inside ``messages`` (Claude Code sends one after the first user turn) is accepted as a
system message in place. ``cache_control`` is ignored everywhere.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, AsyncIterator

from loongsage.agentflow.errors import RequestError
from loongsage.agentflow.messages import ChatRequest, SamplingOptions, content_text
from loongsage.agentflow.protocols.base import (
    StreamEvent, TurnResult, function_tool, get_field, require_object, sse, stop_list,
)

SKIPPED_BLOCKS = ("thinking", "redacted_thinking")
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               503: "overloaded_error"}
EMPTY_TEXT = {"type": "text", "text": ""}


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b if isinstance(b, dict) else {"type": "text", "text": str(b)} for b in content]
    raise RequestError(f"{where}: expected a string or a list of content blocks", param=where)


def _tool_use(block: dict[str, Any], fallback_id: str) -> dict[str, Any]:
    args = json.dumps(block.get("input") or {}, ensure_ascii=False, separators=(",", ":"))
    return {"id": block.get("id") or fallback_id, "type": "function",
            "function": {"name": block.get("name"), "arguments": args}}


def _message(m: Any, i: int) -> list[dict[str, Any]]:
    where = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
        raise RequestError(f"{where}.role: expected user, assistant or system",
                           param=f"{where}.role")
    role, text, calls, results = m["role"], [], [], []
    for j, block in enumerate(_blocks(m.get("content"), f"{where}.content")):
        kind, bw = block.get("type"), f"{where}.content[{j}]"
        if kind == "text":
            text.append(str(block.get("text", "")))
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(block, f"toolu_{i}_{j}"))
        elif kind == "tool_result" and role == "user":
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id") or "",
                            "content": content_text(block.get("content"), f"{bw}.content")})
        elif kind not in SKIPPED_BLOCKS:
            raise RequestError(f"{bw}.type: unsupported content block {kind!r} in a {role} "
                               "message", param=bw)
    out = list(results)
    if text or calls or not results:
        msg: dict[str, Any] = {"role": role, "content": "".join(text)}
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def _stop_reason(result: TurnResult) -> str:
    if result.tool_calls:
        return "tool_use"
    return "max_tokens" if result.finish_reason == "length" else "end_turn"


def _tool_block(call: Any) -> dict[str, Any]:
    args = call.args_object()
    return {"type": "tool_use", "id": call.id, "name": call.name,
            "input": args if isinstance(args, dict) else {}}


def _usage(result: TurnResult) -> dict[str, int]:
    return {"input_tokens": result.prompt_tokens, "output_tokens": result.completion_tokens}


class AnthropicMessagesAdapter:
    wire = "anthropic_messages"

    def parse_request(self, body: Any) -> ChatRequest:
        body = require_object(body, "messages")
        messages: list[dict[str, Any]] = []
        system = body.get("system")
        if system:
            messages.append({"role": "system", "content": content_text(system, "system")})
        for i, m in enumerate(get_field(body, "messages", list, required=True)):
            messages.extend(_message(m, i))
        tools = [function_tool(t.get("name"), t.get("description"), t.get("input_schema"),
                               f"tools[{i}]")
                 for i, t in enumerate(get_field(body, "tools", list, []))
                 if isinstance(t, dict) and "input_schema" in t]
        sampling = SamplingOptions(
            max_tokens=get_field(body, "max_tokens", int),
            temperature=float(get_field(body, "temperature", (int, float), 1.0)),
            top_p=float(get_field(body, "top_p", (int, float), 1.0)),
            top_k=int(get_field(body, "top_k", int, -1)),
            seed=get_field(body, "seed", int),
            stop=stop_list(body.get("stop_sequences"), "stop_sequences"))
        return ChatRequest(wire=self.wire, model=get_field(body, "model", str, required=True),
                           messages=messages, tools=tools, sampling=sampling,
                           stream=bool(get_field(body, "stream", bool, False)), raw=body)

    def render_response(self, request: ChatRequest, result: TurnResult) -> dict[str, Any]:
        content = [{"type": "text", "text": result.content}]
        if not result.content and result.tool_calls:
            content = []
        content.extend(_tool_block(c) for c in result.tool_calls)
        return {"id": f"msg_{result.response_id}", "type": "message", "role": "assistant",
                "model": request.model, "content": content, "stop_reason": _stop_reason(result),
                "stop_sequence": None, "usage": _usage(result)}

    async def stream_response(self, request: ChatRequest,
                              events: AsyncIterator[StreamEvent]) -> AsyncIterator[str]:
        def event(kind: str, **data: Any) -> str:
            return sse({"type": kind, **data}, event=kind)

        start = {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
                 "model": request.model, "content": [], "stop_reason": None,
                 "stop_sequence": None,
                 "usage": {"input_tokens": request.prompt_tokens, "output_tokens": 0}}
        yield event("message_start", message=start)
        index, text_open = 0, False
        async for ev in events:
            if ev.text:
                if not text_open:
                    text_open = True
                    yield event("content_block_start", index=index, content_block=EMPTY_TEXT)
                yield event("content_block_delta", index=index,
                            delta={"type": "text_delta", "text": ev.text})
            if ev.result is None:
                continue
            res = ev.result
            if not text_open and not res.tool_calls:
                text_open = True
                yield event("content_block_start", index=index, content_block=EMPTY_TEXT)
            if text_open:
                yield event("content_block_stop", index=index)
                index += 1
            for call in res.tool_calls:
                block = _tool_block(call)
                partial = json.dumps(block["input"], ensure_ascii=False)
                yield event("content_block_start", index=index,
                            content_block={**block, "input": {}})
                yield event("content_block_delta", index=index,
                            delta={"type": "input_json_delta", "partial_json": partial})
                yield event("content_block_stop", index=index)
                index += 1
            yield event("message_delta", usage=_usage(res),
                        delta={"stop_reason": _stop_reason(res), "stop_sequence": None})
            yield event("message_stop")

    def render_error(self, error: RequestError) -> dict[str, Any]:
        kind = ERROR_TYPES.get(error.status, "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": error.message}}
