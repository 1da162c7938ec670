"""Who may talk to a router: loopback by default; an exposed router needs an API key.

A router bound to a loopback address (``127.0.0.1``, ``::1``, ``localhost``) is reached only
from its machine and names trajectories by id, as agents started by the run do. Binding any
other address requires an API key (``agentflow.api_key``, else the ``LOONGSAGE_ROUTER_API_KEY``
environment variable): without one the router refuses to start. With a key, every
trajectory opened gets an unguessable token (``secrets.token_urlsafe``, 128 bits) that its
agent uses in place of the id (path prefix ``/{token}/{attempt_id}`` or API key
``{token}:{attempt_id}``); a request naming a trajectory by its bare id is refused, so a
client cannot write into another trajectory by guessing its id, and the read-only
endpoints (trajectory listings) need the router's key as ``Authorization: Bearer``. The holder
of the router's own key (``Authorization: Bearer <key>`` or ``x-api-key``) may name any
trajectory by its id (``/{trajectory_id}/{attempt_id}/v1/...``; without a path, trajectory
``default``): it is the operator, e.g. of ``loongsage serve``, whose printed URLs carry an
issued token.

Request bodies are capped (``max_body_bytes``): a larger one is refused with 413 before it
is read whole, and one not received whole within ``body_timeout_s`` with 408; a connection
that has not sent its request headers within ``header_timeout_s`` is closed
(``http_thread.header_timeout_protocol``), so slow clients cannot hold connections open.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import os
import secrets

from loongsage.agentflow.errors import RequestError
from loongsage.errors import ConfigError

API_KEY_ENV = "LOONGSAGE_ROUTER_API_KEY"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def router_api_key(configured: str | None, host: str) -> str | None:
    """The key an exposed router checks; raises ``ConfigError`` for a non-loopback ``host`` without one."""
    key = configured or os.environ.get(API_KEY_ENV) or None
    if key is None and not is_loopback(host):
        raise ConfigError("agentflow.api_key", f"the router binds {host!r}, reachable from other machines: "
                          f"set agentflow.api_key (or {API_KEY_ENV}) or bind 127.0.0.1")
    return key


class TrajectoryTokens:
    """Tokens issued per open trajectory when the router has an API key."""

    def __init__(self, api_key: str | None) -> None:
        self.api_key = api_key
        self._keys: dict[str, tuple[str, str]] = {}  # token -> (trajectory_id, attempt_id)
        self._tokens: dict[tuple[str, str], str] = {}

    @property
    def required(self) -> bool:
        return self.api_key is not None

    def issue(self, trajectory_id: str, attempt_id: str) -> str:
        key = (str(trajectory_id), str(attempt_id))
        token = secrets.token_urlsafe(16)
        self._keys[token], self._tokens[key] = key, token
        return token

    def public_id(self, trajectory_id: str, attempt_id: str) -> str:
        """What the agent names its trajectory by: the token when required, else the id."""
        return self._tokens.get((str(trajectory_id), str(attempt_id)), str(trajectory_id)) if self.required \
            else str(trajectory_id)

    def revoke(self, trajectory_id: str, attempt_id: str) -> None:
        token = self._tokens.pop((str(trajectory_id), str(attempt_id)), None)
        self._keys.pop(token, None)

    def is_router_key(self, given: str) -> bool:
        """Whether ``given`` is the router's own key (never true without one)."""
        return self.api_key is not None and hmac.compare_digest(given.encode(), self.api_key.encode())

    def resolve(self, name: str, attempt_id: str, trusted: bool = False) -> tuple[str, str]:
        """(trajectory_id, attempt_id) a request names; a bare id is refused when tokens are
        required, unless the request holds the router's key (``trusted``)."""
        key = self._keys.get(name)
        if key is not None:
            return key
        if self.required and not trusted:
            raise RequestError("unknown trajectory key: this router takes the key issued for each "
                               "trajectory, not its id", status=401, kind="authentication_error")
        return name, attempt_id

    def check_reader(self, authorization: str) -> None:
        """The router's own key for the read-only endpoints (when it has one)."""
        if self.api_key is None:
            return
        given = authorization[7:].strip() if authorization.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            raise RequestError("this endpoint needs the router's API key as 'Authorization: Bearer <key>'",
                               status=401, kind="authentication_error")


async def capped_body(http, max_bytes: int, timeout_s: float | None = None) -> bytes:
    """The request body, refused with 413 past ``max_bytes`` (declared or streamed) and with
    408 when it is not received whole within ``timeout_s``."""
    declared = http.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise RequestError(f"request body of {declared} bytes exceeds the router's limit of {max_bytes}",
                           status=413)

    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in http.stream():
            size += len(chunk)
            if size > max_bytes:
                raise RequestError(f"request body exceeds the router's limit of {max_bytes} bytes", status=413)
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        raise RequestError(f"request body not received whole within the router's {timeout_s:g} s "
                           "(agentflow.body_timeout_s)", status=408) from None
