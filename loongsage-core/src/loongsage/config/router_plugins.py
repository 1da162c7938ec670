"""The AgentFlow router's plugins, resolved from config once: its middleware chain and its tool parser.

Config validation resolves them here (``RunConfig.router``: ``router_plugins`` completes the
chain and tool parser it resolved) and the router is handed the result
(``RouterSettings.from_config(section, run.router)``), so no router or middleware looks a plugin
name up. The built-in ``tool_call_parser`` middleware's ``parser`` parameter names a tool parser
too: it is resolved here as well and becomes the router's tool parser. A router-based agent
resolves the middlewares it adds (its ``middlewares`` parameter) with ``resolve_router_plugins``, from
the registries its ``SourceContext`` lends it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loongsage.registry import PluginRef, Registries
from loongsage.schema import PARSER_MIDDLEWARE, AgentFlowConfig

DEFAULT_TOOL_PARSER = AgentFlowConfig.tool_parser  # the schema's default, for routers built outside a run


@dataclass(frozen=True)
class RouterPlugins:
    """A router's resolved plugins: its middleware chain and the tool parser its built-in
    ``tool_call_parser`` middleware uses (None: not named here)."""

    tool_parser: PluginRef | None = None
    middlewares: tuple[PluginRef, ...] = ()  # in chain order


def resolve_router_plugins(registries: Registries, tool_parser: Any = DEFAULT_TOOL_PARSER,
                           middlewares: Any = None, key: str = "agentflow.middlewares") -> RouterPlugins:
    """``tool_parser`` (a name or node; None: none named) and the ``middlewares`` nodes (errors
    name ``key[i]``) resolved, as ``router_plugins`` completes them."""
    refs = registries.resolve_all("router_middleware", middlewares, key)
    parser = registries.resolve("tool_parser", tool_parser) if tool_parser is not None else None
    return router_plugins(registries, parser, refs, key)


def router_plugins(registries: Registries, tool_parser: PluginRef | None, middlewares: tuple[PluginRef, ...],
                   key: str = "agentflow.middlewares") -> RouterPlugins:
    """The resolved ``tool_parser`` and ``middlewares`` (listed under ``key``) as the router takes
    them: a listed ``tool_call_parser`` with a ``parser`` resolves it, and it overrides ``tool_parser``."""
    for i, ref in enumerate(middlewares):
        if ref.name == PARSER_MIDDLEWARE and ref.params is not None and ref.params.parser:
            tool_parser = registries.resolve("tool_parser", ref.params.parser, f"{key}[{i}].parser")
    return RouterPlugins(tool_parser, middlewares)
