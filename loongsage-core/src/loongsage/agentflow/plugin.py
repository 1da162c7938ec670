"""Core's built-in router middlewares, registered through the same hook as third-party code."""

from loongsage.hookspecs import hookimpl
from loongsage.agentflow.middleware_params import ToolCallParserParams


@hookimpl
def loongsage_register_router_middlewares(register):
    register("tool_call_parser", "loongsage.agentflow.middleware:ToolCallParserMiddleware",
             params=ToolCallParserParams,
             doc="Parse tool calls from generated text with a registered tool parser.")
    register("agent_sessions", "loongsage.agentflow.middleware:AgentSessionsMiddleware",
             doc="Record agents' session headers; start subagent segments on their signals.")
