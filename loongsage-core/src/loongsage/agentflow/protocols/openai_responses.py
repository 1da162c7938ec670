"""OpenAI Responses (``/v1/responses``), the only wire Codex speaks.

Input items become internal messages: ``message`` items by role (``developer`` → system),
consecutive assistant ``message`` + ``function_call`` items merge into one assistant turn,
``function_call_output`` → tool message; ``reasoning`` items are dropped (Codex echoes
ours; they carry nothing the stored tokens lack). Only ``function`` tools reach the model;
hosted tools (``web_search``, ...) cannot be executed by it and are left out.
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
)

SKIPPED_ITEMS = ("reasoning", "item_reference")


def _function_call(item: dict[str, Any], i: int, where: str) -> dict[str, Any]:
    if not isinstance(item.get("name"), str):
        raise RequestError(f"{where}.name: a function_call needs a string name",
                           param=f"{where}.name")
    args = item.get("arguments", "{}")
    return {"id": item.get("call_id") or item.get("id") or f"call_{i}", "type": "function",
            "function": {"name": item["name"],
                         "arguments": args if isinstance(args, str) else json.dumps(args)}}


def _items_to_messages(items: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    open_assistant = False  # the last message is an assistant turn that may take function calls
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(f"{where}: expected an object", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("system", "developer", "user", "assistant"):
                raise RequestError(f"{where}.role: expected system, developer, user or assistant, "
                                   f"got {role!r}", param=f"{where}.role")
            out.append({"role": "system" if role == "developer" else role,
                        "content": content_text(item.get("content"), f"{where}.content")})
            open_assistant = role == "assistant"
        elif kind == "function_call":
            call = _function_call(item, i, where)
            if not open_assistant:
                out.append({"role": "assistant", "content": ""})
                open_assistant = True
            out[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.get("call_id") or "",
                        "content": content_text(item.get("output", ""), f"{where}.output")})
            open_assistant = False
        elif kind not in SKIPPED_ITEMS:
            raise RequestError(f"{where}.type: unsupported input item type {kind!r}",
                               param=f"{where}.type")
    return out


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def _message_item(item_id: str, text: str, done: bool = True) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": "completed" if done else "in_progress",
            "role": "assistant", "content": [_text_part(text)] if done else []}


def _call_item(call: Any) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call.id}", "call_id": call.id,
            "name": call.name, "arguments": call.arguments, "status": "completed"}


class OpenAIResponsesAdapter:
    wire = "openai_responses"

    def parse_request(self, body: Any) -> ChatRequest:
        body = require_object(body, "responses")
        if body.get("previous_response_id"):
            raise RequestError("previous_response_id: not supported; re-send the full input "
                               "(store=false)", param="previous_response_id")
        raw_input = body.get("input")
        if isinstance(raw_input, str):
            messages = [{"role": "user", "content": raw_input}]
        elif isinstance(raw_input, list):
            messages = _items_to_messages(raw_input)
        else:
            raise RequestError("input: expected a string or a list of items", param="input")
        instructions = get_field(body, "instructions", str)
        if instructions:
            messages.insert(0, {"role": "system", "content": instructions})
        tools = [function_tool(t.get("name"), t.get("description"), t.get("parameters"),
                               f"tools[{i}]")
                 for i, t in enumerate(get_field(body, "tools", list, []))
                 if isinstance(t, dict) and t.get("type") == "function"]
        sampling = SamplingOptions(
            max_tokens=get_field(body, "max_output_tokens", int),
            temperature=float(get_field(body, "temperature", (int, float), 1.0)),
            top_p=float(get_field(body, "top_p", (int, float), 1.0)),
            seed=get_field(body, "seed", int))
        return ChatRequest(wire=self.wire, model=get_field(body, "model", str, required=True),
                           messages=messages, tools=tools, sampling=sampling,
                           stream=bool(get_field(body, "stream", bool, False)), raw=body)

    @staticmethod
    def _response(request: ChatRequest, resp_id: str, created: int,
                  output: list[dict[str, Any]], result: TurnResult | None) -> dict[str, Any]:
        status = "in_progress"
        if result is not None:
            cut = result.finish_reason == "length" and not result.tool_calls
            status = "incomplete" if cut else "completed"
        body: dict[str, Any] = {
            "id": resp_id, "object": "response", "created_at": created, "model": request.model,
            "status": status, "output": output,
            "parallel_tool_calls": bool(request.raw.get("parallel_tool_calls", True)),
            "tool_choice": request.raw.get("tool_choice", "auto"),
            "tools": request.raw.get("tools", []),
            "incomplete_details": None, "error": None, "usage": None,
        }
        if result is not None:
            if status == "incomplete":
                body["incomplete_details"] = {"reason": "max_output_tokens"}
            body["usage"] = {"input_tokens": result.prompt_tokens,
                             "output_tokens": result.completion_tokens,
                             "total_tokens": result.prompt_tokens + result.completion_tokens,
                             "input_tokens_details": {"cached_tokens": 0},
                             "output_tokens_details": {"reasoning_tokens": 0}}
        return body

    def render_response(self, request: ChatRequest, result: TurnResult) -> dict[str, Any]:
        output = []
        if result.content or not result.tool_calls:
            output.append(_message_item(f"msg_{result.response_id}", result.content))
        output.extend(_call_item(c) for c in result.tool_calls)
        return self._response(request, f"resp_{result.response_id}", result.created, output,
                              result)

    async def stream_response(self, request: ChatRequest,
                              events: AsyncIterator[StreamEvent]) -> AsyncIterator[str]:
        seq = 0
        resp_id, created = f"resp_{uuid.uuid4().hex[:24]}", int(time.time())
        msg_id = f"msg_{uuid.uuid4().hex[:24]}"
        where = {"item_id": msg_id, "output_index": 0, "content_index": 0}

        def event(kind: str, **data: Any) -> str:
            nonlocal seq
            seq += 1
            return sse({"type": kind, "sequence_number": seq - 1, **data}, event=kind)

        def open_message() -> list[str]:
            return [event("response.output_item.added", output_index=0,
                          item=_message_item(msg_id, "", done=False)),
                    event("response.content_part.added", **where, part=_text_part(""))]

        empty = self._response(request, resp_id, created, [], None)
        yield event("response.created", response=empty)
        yield event("response.in_progress", response=empty)
        text, started, output = "", False, []
        async for ev in events:
            if ev.text:
                if not started:
                    started = True
                    for chunk in open_message():
                        yield chunk
                text += ev.text
                yield event("response.output_text.delta", **where, delta=ev.text, logprobs=[])
            if ev.result is None:
                continue
            res = ev.result
            if started or not res.tool_calls:
                for chunk in ([] if started else open_message()):
                    yield chunk
                yield event("response.output_text.done", **where, text=text, logprobs=[])
                yield event("response.content_part.done", **where, part=_text_part(text))
                output.append(_message_item(msg_id, text))
                yield event("response.output_item.done", output_index=0, item=output[-1])
            for call in res.tool_calls:
                idx, item = len(output), _call_item(call)
                at = {"item_id": item["id"], "output_index": idx}
                yield event("response.output_item.added", output_index=idx,
                            item={**item, "arguments": "", "status": "in_progress"})
                yield event("response.function_call_arguments.delta", **at, delta=call.arguments)
                yield event("response.function_call_arguments.done", **at, arguments=call.arguments)
                yield event("response.output_item.done", output_index=idx, item=item)
                output.append(item)
            yield event("response.completed",
                        response=self._response(request, resp_id, created, output, res))

    def render_error(self, error: RequestError) -> dict[str, Any]:
        return openai_error(error)
