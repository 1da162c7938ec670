"""Router settings (the ``agentflow`` config section plus what the caller wires in)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RouterSettings:
    host: str = "127.0.0.1"
    port: int = 0  # 0 = pick a free port
    served_model_names: list[str] = field(default_factory=lambda: ["policy"])
    accept_any_model: bool = False  # black-box agents that insist on their own model names
    untrained_models: list[str] = field(default_factory=list)  # served, never trained (titles)
    tool_parser: str = "hermes"
    # names, {"name": ..., "params": {...}} or {"name": ..., **params} (validated config)
    middlewares: list[Any] = field(default_factory=list)
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

    @classmethod
    def from_config(cls, agentflow: Any, **overrides: Any) -> "RouterSettings":
        """Settings from the ``agentflow`` config section (host, port, tool_parser, middlewares, api_key,
        max_body_bytes, header_timeout_s, body_timeout_s)."""
        if hasattr(agentflow, "get"):
            get = agentflow.get
        else:
            def get(key, default=None):
                return getattr(agentflow, key, default)
        values = {k: get(k) for k in ("host", "port", "tool_parser", "api_key", "max_body_bytes",
                                          "header_timeout_s", "body_timeout_s")
                  if get(k) is not None}
        values["middlewares"] = list(get("middlewares") or [])
        values.update(overrides)
        return cls(**values)
