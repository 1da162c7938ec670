"""The one internal request every wire format is normalised into, and message canonicalisation.

Internal messages are OpenAI-chat-shaped dicts (``role``, ``content`` as a string,
assistant ``tool_calls`` as ``[{"id", "type": "function", "function": {"name", "arguments"}}]``,
tool results as ``role: "tool"`` with ``tool_call_id``), which is what HF chat templates take.

``canonical(message)`` is what prefix matching compares. Real agents re-send history with
changes that carry no meaning for the model (docs/agents.md records each agent's wire behaviour):
Claude Code moves
``cache_control``, OpenCode re-serialises tool-call arguments compactly, the Agents SDK
drops ``reasoning_content``, Codex echoes our items with ids and encrypted reasoning. The
canonical form therefore keeps only role, stripped text, tool names with *parsed* arguments
and tool results; ids, reasoning and cache hints are left out.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from loongsage.agentflow.errors import RequestError
from loongsage.engines.sampling_seed import SEED_KEY


@dataclass
class SamplingOptions:
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)  # token-in clients send their own
    seed: int | None = None  # the client's; sent to the engine as its sampling_seed

    def __post_init__(self) -> None:
        """Refuse values no engine takes, naming the field (the engine's refusal would reach
        the client as a failed turn, not as its own mistake)."""
        checks = (("max_tokens", self.max_tokens is None or self.max_tokens >= 1, "must be >= 1"),
                  ("temperature", math.isfinite(self.temperature) and self.temperature >= 0, "must be >= 0"),
                  ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
                  ("top_k", self.top_k == -1 or self.top_k >= 1, "must be -1 (off) or >= 1"))
        for name, ok, expected in checks:
            if not ok:
                raise RequestError(f"{name}: {expected}, got {getattr(self, name)!r}", param=name)

    def to_engine(self, default_max: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "max_new_tokens": self.max_tokens if self.max_tokens is not None else default_max,
            "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
        }
        if self.stop:
            out["stop"] = list(self.stop)
        if self.stop_token_ids:
            out["stop_token_ids"] = list(self.stop_token_ids)
        if self.seed is not None:  # any int a client sends, folded into the engine's range
            out[SEED_KEY] = self.seed % (1 << 63)
        return out


POLICY_FIELDS = ("temperature", "top_p", "top_k")  # what defines the sampling distribution


def enforce_sampling(asked: dict[str, Any], rollout: dict[str, Any] | None
                     ) -> tuple[dict[str, Any], list[str]]:
    """Engine sampling for a trained turn of a trajectory opened with ``rollout`` sampling.

    The rollout's ``temperature``/``top_p``/``top_k`` replace what the client asked for (a
    black-box CLI sends its own, or none), so every trained token comes from the distribution
    the algorithm assumes; its ``max_new_tokens`` caps the client's ``max_tokens``. Stop
    strings stay the client's (they are part of how the agent reads replies). Returns the
    sampling and the names of the fields that changed.
    """
    if not rollout:
        return asked, []
    out, changed = dict(asked), []
    for name in POLICY_FIELDS:
        if rollout.get(name) is not None and out.get(name) != rollout[name]:
            out[name] = rollout[name]
            changed.append(name)
    cap = rollout.get("max_new_tokens")
    if cap is not None and out["max_new_tokens"] > cap:
        out["max_new_tokens"] = int(cap)
        changed.append("max_new_tokens")
    return out, changed


@dataclass
class ChatRequest:
    """A wire request normalised: messages (or a token-in prompt), tools, sampling, streaming,
    and the raw body."""

    wire: str  # openai_chat | openai_responses | anthropic_messages | token_generate
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI function-tool shape
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    stream: bool = False
    include_usage: bool = False
    raw: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: int = 0  # set once the turn is planned (streams report it up front)
    # a token-in request (``/inference/v1/generate``): the client's rendered prompt, no messages
    prompt_ids: list[int] | None = None


TEXT_PARTS = ("text", "input_text", "output_text")


def content_text(content: Any, where: str) -> str:
    """Text of an OpenAI/Anthropic content value: a string or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") in TEXT_PARTS:
                parts.append(str(part.get("text", "")))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestError(f"{where}[{i}]: unsupported content part type {kind!r}; "
                                   "only text parts are supported")
        return "".join(parts)
    raise RequestError(f"{where}: content must be a string or a list of parts, "
                       f"got {type(content).__name__}")


def parsed_arguments(arguments: Any) -> Any:
    """Tool-call arguments as an object when they are JSON text, else the stripped text."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments.strip()
    return arguments


def canonical(message: dict[str, Any]) -> tuple:
    """The meaning of a message for prefix matching (see module docstring)."""
    role = message.get("role")
    if role == "developer":
        role = "system"
    functions = [c.get("function", c) for c in message.get("tool_calls") or ()]
    calls = tuple((f.get("name"), json.dumps(parsed_arguments(f.get("arguments")), sort_keys=True))
                  for f in functions)
    return (role, (message.get("content") or "").strip(), calls)


def canonical_tools(tools: list[dict[str, Any]]) -> str:
    return json.dumps(tools, sort_keys=True)


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: tool-call arguments as objects."""
    out = []
    for m in messages:
        m2 = {k: v for k, v in m.items() if v is not None and not k.startswith("_")}
        if m2.get("tool_calls"):
            m2["tool_calls"] = [
                {**c, "function": {**c["function"],
                                   "arguments": parsed_arguments(c["function"]["arguments"])}}
                for c in m2["tool_calls"]
            ]
        out.append(m2)
    return out
