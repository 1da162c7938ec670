"""Hermes / Qwen2.5 style: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks.

Content rules are in ``blocks.py``. A block whose body is not a JSON object with a string
``name`` stays in the content as text. Arguments are re-emitted as compact JSON.
"""

from __future__ import annotations

import json

from loongsage.plugin import ParsedOutput, ToolCall
from loongsage_agents.tool_parsers.blocks import START, split_blocks



def _call(body: str) -> ToolCall | None:
    try:
        obj = json.loads(body.strip())
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return ToolCall.from_args(obj["name"], args if args is not None else {})


class HermesToolParser:
    """Hermes/Qwen ``<tool_call>{json}</tool_call>`` tool calls."""

    start_marker = START

    def parse(self, text: str) -> ParsedOutput:
        return split_blocks(text, _call)

    def render(self, calls: list[ToolCall]) -> str:
        """Qwen2.5's template layout: one block per call, JSON with spaces after separators."""
        return "\n".join(
            f'<tool_call>\n{json.dumps({"name": c.name, "arguments": c.args_object()}, ensure_ascii=False)}'
            "\n</tool_call>" for c in calls)
