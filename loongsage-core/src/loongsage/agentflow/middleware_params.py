"""Parameter dataclasses of the built-in router middlewares (import-cheap, for plugin.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ToolCallParserParams:
    """Parse tool calls from generated text with a registered tool parser."""

    parser: str = ""  # empty = the router's agentflow.tool_parser
