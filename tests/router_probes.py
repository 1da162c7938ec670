"""A tool-call syntax no shipped parser reads, for tests of run-time router plugins.

``CallLineParser`` reads and writes tool calls as ``CALL name {json}``; ``LS`` is an OpenAI tool
schema the scripted model calls with it; ``TagParams`` are the parameters of a probe
middleware that tags each finished turn. Shared by tests/agentflow's plugin-hook and
resolved-router tests, whose probe plugins register them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from loongsage.agentflow.tool_calls import ParsedOutput, ToolCall

CALL = re.compile(r"CALL (\w+) (\{.*\})", re.S)
LS = {"type": "function", "function": {
    "name": "ls", "description": "List files",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}


class CallLineParser:
    """Tool calls written as ``CALL name {json}`` (a syntax no shipped parser reads)."""

    start_marker = "CALL "

    def parse(self, text: str) -> ParsedOutput:
        found = CALL.search(text)
        if found is None:
            return ParsedOutput(content=text)
        return ParsedOutput(text[: found.start()].strip(), [ToolCall.from_args(found[1], json.loads(found[2]))])

    def render(self, calls: list[ToolCall]) -> str:
        return "\n".join(f"CALL {c.name} {c.arguments}" for c in calls)


@dataclass
class TagParams:
    """Tag every finished turn."""

    tag: str = "probe"
