"""Router settings (the ``agentflow`` config section plus what the caller wires in).

The router's plugins arrive resolved: ``middlewares`` (its chain) and ``tool_parser`` are the
``PluginRef``s config validation made (``RunConfig.router``, by
``loongsage.config.router_plugins.resolve_router_plugins``), so the router builds what it is
handed and never looks a plugin name up.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loongsage.agentflow.tool_calls import PlainParser, ToolParser
from loongsage.registry import PluginRef

if TYPE_CHECKING:  # config sits below agentflow: the router takes what config made, never calls it
    from loongsage.config.router_plugins import RouterPlugins


@dataclass
class RouterSettings:
    host: str = "127.0.0.1"
    port: int = 0  # 0 = pick a free port
    served_model_names: list[str] = field(default_factory=lambda: ["policy"])
    accept_any_model: bool = False  # black-box agents that insist on their own model names
    untrained_models: list[str] = field(default_factory=list)  # served, never trained (titles)
    # the resolved tool_parser PluginRef the tool_call_parser middleware builds its parser from
    # (agentflow.tool_parser, or that middleware's `parser`); None = replies are never parsed for calls
    tool_parser: PluginRef | None = None
    # resolved router_middleware PluginRefs in chain order; tool_call_parser is added last unless listed
    middlewares: tuple[PluginRef, ...] = ()
    auto_create_trajectories: bool = False  # `loongsage serve`: any key opens a trajectory
    # `loongsage serve --session-header`: a request carrying this header (e.g. verifiers'
    # x-session-id, one per rollout) goes to trajectory "<trajectory_id>.<session>" of its key
    session_header: str | None = None
    default_max_tokens: int = 1024
    max_context: int | None = None  # tokens; None = the tokenizer's model_max_length if sane
    clamp_max_tokens: bool = True  # max_tokens beyond the context left is lowered, not refused
    max_inflight_per_engine: int = 64  # requests sent to one replica at once; the rest queue here
    run_dir: str | None = None  # finished trajectories are appended to run_dir/trajectories.jsonl
    api_key: str | None = None  # needed to bind a non-loopback host (else LOONGSAGE_ROUTER_API_KEY); see access.py
    max_body_bytes: int = 32 << 20  # larger request bodies are refused with 413
    header_timeout_s: float = 30.0  # a connection still sending its request headers then is closed
    body_timeout_s: float = 120.0  # a body not received whole by then is refused with 408

    def with_plugins(self, plugins: "RouterPlugins") -> "RouterSettings":
        """These settings with ``plugins``' middlewares after their own, and ``plugins``' tool
        parser when it names one (an agent's middlewares after the run's)."""
        return dataclasses.replace(
            self, middlewares=(*self.middlewares, *plugins.middlewares),
            tool_parser=plugins.tool_parser if plugins.tool_parser is not None else self.tool_parser)

    def make_parser(self) -> ToolParser:
        """A new instance of the router's tool parser (``PlainParser``, which finds no tool
        calls, when it has none)."""
        return self.tool_parser.obj() if self.tool_parser is not None else PlainParser()

    @classmethod
    def from_config(cls, agentflow: Any, plugins: "RouterPlugins", **overrides: Any) -> "RouterSettings":
        """Settings from the ``agentflow`` config section (host, port, api_key, max_body_bytes,
        header_timeout_s, body_timeout_s) and its plugins as validation resolved them
        (``RunConfig.router``)."""
        if hasattr(agentflow, "get"):
            get = agentflow.get
        else:
            def get(key, default=None):
                return getattr(agentflow, key, default)
        values = {k: get(k) for k in ("host", "port", "api_key", "max_body_bytes",
                                          "header_timeout_s", "body_timeout_s")
                  if get(k) is not None}
        values.update(overrides)
        return cls(**values).with_plugins(plugins)
