"""adder-tools: a verifiers v1 environment whose tasks ask for a sum, with an MCP `add` tool."""

from adder_tools.taskset import AdderTaskset

__all__ = ["AdderTaskset"]
