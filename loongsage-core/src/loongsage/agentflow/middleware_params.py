"""Parameter dataclasses of the built-in router middlewares (import-cheap, for plugin.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ToolCallParserParams:
    """Parse tool calls from generated text with a registered tool parser."""

    # empty = the router's agentflow.tool_parser; a name is resolved by config validation
    # (config.router_plugins) and handed to the router as RouterSettings.tool_parser
    parser: str = ""
