"""What every wire adapter shares: the turn result, stream events, SSE framing, field checks."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Protocol

from loongsage.agentflow.errors import RequestError
from loongsage.agentflow.messages import ChatRequest
from loongsage.agentflow.tool_calls import ToolCall


@dataclass
class TurnResult:
    """One generated assistant turn, wire-independent."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"  # stop | length | tool_calls
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str = ""
    output_ids: list[int] = field(default_factory=list)  # the sampled tokens (token-in replies)
    output_logprobs: list[float] = field(default_factory=list)
    response_id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass
class StreamEvent:
    """``text`` carries a content piece; the last event has ``result`` set."""

    text: str = ""
    result: TurnResult | None = None


class WireAdapter(Protocol):
    wire: str

    def parse_request(self, body: Any) -> ChatRequest: ...

    def render_response(self, request: ChatRequest, result: TurnResult) -> dict[str, Any]: ...

    def stream_response(self, request: ChatRequest,
                        events: AsyncIterator[StreamEvent]) -> AsyncIterator[str]: ...

    def render_error(self, error: RequestError) -> dict[str, Any]: ...


def sse(data: Any, event: str | None = None) -> str:
    """One server-sent event."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n"


def require_object(body: Any, what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(f"{what}: the request body must be a JSON object, "
                           f"got {type(body).__name__}")
    return body


def get_field(body: dict[str, Any], name: str, types: type | tuple, default: Any = None,
              required: bool = False) -> Any:
    """Read ``body[name]`` checking its type; the error names the field and the expected type."""
    if name not in body or body[name] is None:
        if required:
            raise RequestError(f"{name}: required field is missing", param=name)
        return default
    value = body[name]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise RequestError(f"{name}: expected {_names(types)}, got a boolean", param=name)
    if not isinstance(value, types):
        raise RequestError(f"{name}: expected {_names(types)}, got {type(value).__name__}",
                           param=name)
    return value


def _names(types: type | tuple) -> str:
    seq = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in seq)


def stop_list(value: Any, name: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return list(value)
    raise RequestError(f"{name}: expected a string or a list of strings", param=name)


def function_tool(name: Any, description: Any, parameters: Any, where: str) -> dict[str, Any]:
    if not isinstance(name, str) or not name:
        raise RequestError(f"{where}.name: a tool needs a non-empty string name", param=where)
    fn: dict[str, Any] = {"name": name}
    if description:
        fn["description"] = description
    if not isinstance(parameters, dict):
        parameters = {"type": "object", "properties": {}}
    fn["parameters"] = parameters
    return {"type": "function", "function": fn}


def openai_error(error: RequestError) -> dict[str, Any]:
    """OpenAI's error body (both Chat Completions and Responses)."""
    code = error.kind if error.kind != "invalid_request_error" else None
    return {"error": {"message": error.message, "type": error.kind, "param": error.param,
                      "code": code}}
