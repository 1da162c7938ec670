"""The tool-parser contract and a streaming splitter built on it.

A tool parser (plugin kind ``tool_parser``) is a class whose instances have
``start_marker: str`` (the text that opens a tool call),
``parse(text: str) -> ParsedOutput`` and its inverse ``render(calls) -> str`` (the text a
model writes for those calls; SFT demonstrations use it for chat templates that do not
render tool calls themselves). The router streams text up to a possible
``start_marker`` and holds back the rest until the generation ends, so streamed and
non-streamed replies carry the same content and tool calls.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class ToolCall:
    """One function call; ``arguments`` is compact JSON text (OpenCode re-sends it compactly)."""

    name: str
    arguments: str = "{}"
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    @classmethod
    def from_args(cls, name: str, args: Any, id: str | None = None) -> "ToolCall":
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False, separators=(",", ":"))
        return cls(name=name, arguments=args) if id is None else cls(name, args, id)

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}

    def args_object(self) -> Any:
        try:
            return json.loads(self.arguments)
        except ValueError:
            return self.arguments


@dataclass
class ParsedOutput:
    """Generated text split into plain content and tool calls."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)


class ToolParser(Protocol):
    start_marker: str

    def parse(self, text: str) -> ParsedOutput: ...

    def render(self, calls: list[ToolCall]) -> str: ...


class PlainParser:
    """No tool calls: the whole text is content (used when a request carries no tools)."""

    start_marker = ""

    def parse(self, text: str) -> ParsedOutput:
        return ParsedOutput(content=text)


class StreamSplitter:
    """Feed generated text piece by piece; get back the text that is safe to stream now.

    Text from the first ``start_marker`` on is held back (it may be a tool call), as is a
    trailing piece that could be the beginning of the marker. ``finish()`` parses everything
    and returns the content not yet streamed plus the tool calls.
    """

    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self.text = ""
        self.emitted = 0
        self.held = False

    def feed(self, piece: str) -> str:
        self.text += piece
        marker = self.parser.start_marker
        if self.held:
            return ""
        if marker:
            at = self.text.find(marker, self.emitted)
            if at >= 0:
                self.held = True
                return self._emit_to(at)
            keep = 0
            for k in range(min(len(marker) - 1, len(self.text) - self.emitted), 0, -1):
                if self.text.endswith(marker[:k]):
                    keep = k
                    break
            return self._emit_to(len(self.text) - keep)
        return self._emit_to(len(self.text))

    def _emit_to(self, end: int) -> str:
        out = self.text[self.emitted:end]
        self.emitted = max(self.emitted, end)
        return out

    def finish(self) -> tuple[str, ParsedOutput]:
        """(content still to stream, full parse); the parse's content starts with what was sent."""
        parsed = self.parser.parse(self.text)
        streamed = self.text[: self.emitted]
        if not parsed.content.startswith(streamed):
            # the parser rewrote text already sent; report what the client has seen
            parsed.content = streamed + parsed.content[len(streamed):]
        return parsed.content[len(streamed):], parsed
