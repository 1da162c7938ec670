"""Router middlewares (plugin kind ``router_middleware``) and the two built-in ones.

A middleware is registered as a factory ``factory(settings: RouterSettings, params) ->
middleware`` (``settings.make_parser()`` gives the router's tool parser); the router builds the
chain config validation resolved from ``agentflow.middlewares`` (``settings.middlewares``; the
built-in ``tool_call_parser`` is always present, appended last unless listed) and looks no
plugin name up. Per request the router
calls, in chain order, ``await on_request(ctx)`` before the turn is planned (a middleware may
set ``ctx.subagent``, choose ``ctx.parser``, annotate ``ctx.trajectory.metadata`` or raise
``RequestError`` to refuse the call) and ``on_result(ctx, result)`` after the turn's tool
calls are parsed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from loongsage.agentflow.messages import ChatRequest
from loongsage.agentflow.middleware_params import ToolCallParserParams
from loongsage.agentflow.protocols.base import TurnResult
from loongsage.agentflow.store import Trajectory
from loongsage.agentflow.tool_calls import PlainParser, ToolParser
from loongsage.schema import PARSER_MIDDLEWARE


@dataclass
class TurnContext:
    """One request as middlewares see it."""

    request: ChatRequest
    headers: dict[str, str]  # lower-cased names
    trajectory: Trajectory
    subagent: bool = False
    trainable: bool = True  # False: a side call kept out of training
    parser: ToolParser = field(default_factory=PlainParser)
    metadata: dict[str, Any] = field(default_factory=dict)


class RouterMiddleware:
    """Base class with no-op hooks; subclasses override what they need."""

    async def on_request(self, ctx: TurnContext) -> None:
        return None

    def on_result(self, ctx: TurnContext, result: TurnResult) -> None:
        return None


class ToolCallParserMiddleware(RouterMiddleware):
    """Parse tool calls from generated text with a registered tool parser."""

    def __init__(self, settings: Any, params: ToolCallParserParams | None) -> None:
        named = params.parser if params is not None else ""
        given = settings.tool_parser.name if settings.tool_parser is not None else None
        if named and named != given:  # the override is resolved with the chain, never here
            raise ValueError(f"{PARSER_MIDDLEWARE} names parser {named!r} but the router's tool parser is "
                             f"{given!r}: resolve the router's plugins with resolve_router_plugins")
        self.parser: ToolParser = settings.make_parser()

    async def on_request(self, ctx: TurnContext) -> None:
        choice = ctx.request.raw.get("tool_choice")
        refused = choice == "none" or (isinstance(choice, dict) and choice.get("type") == "none")
        if ctx.request.tools and not refused:
            ctx.parser = self.parser


SUBAGENT_KINDS = ("collab_spawn", "subagent")


class AgentSessionsMiddleware(RouterMiddleware):
    """Record agents' session headers and start subagent segments on their subagent signals.

    Subagent signals: ``x-loongsage-request-kind: subagent`` (any agent, e.g. from a launcher's
    hook), Codex's ``x-openai-subagent`` header or ``x-codex-turn-metadata`` with
    ``request_kind: collab_spawn``, and an OpenCode ``x-session-id`` other than the first one
    the trajectory saw (a child session). ``x-loongsage-request-kind: untrained`` marks a side
    call kept out of training.
    """

    SESSION_HEADERS = ("session-id", "thread-id", "x-claude-code-session-id", "x-session-id",
                       "x-session-affinity", "x-openai-subagent")

    def __init__(self, settings: Any, params: None) -> None:
        self.settings = settings

    async def on_request(self, ctx: TurnContext) -> None:
        seen = ctx.trajectory.metadata.setdefault("agent_headers", {})
        first = seen.get("x-session-id")
        child_session = first is not None and ctx.headers.get("x-session-id", first) != first
        for name in self.SESSION_HEADERS:
            if name in ctx.headers:
                seen.setdefault(name, ctx.headers[name])
        kind = ctx.headers.get("x-loongsage-request-kind", "")
        turn_meta = ctx.headers.get("x-codex-turn-metadata")
        if turn_meta:
            try:
                kind = kind or str(json.loads(turn_meta).get("request_kind", ""))
            except (ValueError, AttributeError):
                pass
        if kind in SUBAGENT_KINDS or ctx.headers.get("x-openai-subagent") or child_session:
            ctx.subagent = True
        if kind == "untrained":
            ctx.trainable = False
