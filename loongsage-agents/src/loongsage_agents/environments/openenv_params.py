"""Typed parameters of the ``openenv`` environment (torch-free, imported by ``plugin.py``)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Optional

from loongsage_agents.environments.openenv_server import installed_environments

SCHEMA_SLOT = "{action_schema}"  # where the system prompt gets the action's JSON schema
ACTION_FORMATS = ("json", "tool_call")  # how a reply carries its action


@dataclass
class OpenEnvParams:
    """An OpenEnv environment, multi-turn: LoongSage runs the loop (observation -> chat turn ->
    action parsed from the reply -> step) over one WebSocket session per episode."""

    requires: ClassVar[tuple[str, str, str]] = ("openenv", "loongsage-agents", "openenv")

    env: Optional[str] = None  # an installed OpenEnv environment (distribution openenv-<env>), started here
    url: Optional[str] = None  # or the base URL of a running OpenEnv server
    max_turns: int = 8  # model replies per episode (invalid ones included)
    size: int = 1000  # training episodes: reset seeds seed .. seed + size - 1
    held_out_size: int = 100  # held-out episodes: reset seeds held_out_seed .. + held_out_size - 1
    seed: int = 0  # the first training episode's reset seed (the environment draws its task from it)
    held_out_seed: Optional[int] = None  # None = seed + size (disjoint from the training seeds)
    reset_args: Dict[str, Any] = field(default_factory=dict)  # more keyword arguments of reset()
    # None = each observation as compact JSON; a field name = that field's text only
    observation_field: Optional[str] = None
    # json: the first JSON object of the reply's text; tool_call: a call of the tool `act`, whose
    # parameters are the action's schema (the run's agentflow.tool_parser reads it)
    action_format: str = "json"
    # None = the action format's own ({action_schema} in it is replaced by the schema)
    system_prompt: Optional[str] = None
    server_start_timeout_s: float = 60.0  # for the started server to answer /health
    step_timeout_s: float = 60.0  # for the server to answer one reset or step

    def __post_init__(self) -> None:
        if (self.env is None) == (self.url is None):
            raise ValueError("name exactly one of env (an installed OpenEnv environment, started here) "
                             f"and url (a running OpenEnv server), got env={self.env!r} url={self.url!r}")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url: expected an http(s):// base URL of an OpenEnv server, got {self.url!r}")
        if self.max_turns < 1 or self.size < 1 or self.held_out_size < 0:
            raise ValueError("expected max_turns >= 1, size >= 1 and held_out_size >= 0, got "
                             f"{self.max_turns}, {self.size} and {self.held_out_size}")
        if self.action_format not in ACTION_FORMATS:
            raise ValueError(f"action_format: expected one of {', '.join(ACTION_FORMATS)}, "
                             f"got {self.action_format!r}")
        if self.server_start_timeout_s <= 0 or self.step_timeout_s <= 0:
            raise ValueError("expected server_start_timeout_s > 0 and step_timeout_s > 0")
        # without openenv-core the library check that follows names the extra to install
        if self.env is not None and importlib.util.find_spec("openenv") is not None:
            known = installed_environments()
            if self.env not in known:
                listed = ", ".join(known) or "none"
                raise ValueError(f"env: no installed OpenEnv environment {self.env!r} (installed: {listed}); "
                                 f"OpenEnv environments are the distributions named openenv-<env>, "
                                 f"e.g. pip install openenv-{self.env}, or give the url of a running server")
