"""``remote`` backend: a client of ``loongsage sandbox serve`` running on another machine.

Same interface as the local backends; each call is one HTTP request (httpx, one
connection pool per sandbox). Only the shared limits the user actually changed from their
defaults are sent, and the service refuses values above its own limits, so its operator
stays in control. Errors come back with their kind and are raised as the same exception
types a local sandbox raises (``SandboxError`` with ``kind``, ``ConfigError`` for bad
input). ``close()`` deletes the sandbox on the service; if the client dies instead, the
service closes it after its idle timeout.
"""

from __future__ import annotations

import base64
import os
from typing import Any

import httpx

from loongsage.plugin import ConfigError

from loongsage_sandbox.base import ExecResult, FileEntry, Sandbox
from loongsage_sandbox.errors import (
    SandboxClosedError,
    SandboxCrashedError,
    SandboxError,
    SandboxUnavailableError,
    UntrustedCodeRefusedError,
)
from loongsage_sandbox.params import RemoteParams, SandboxParams

_ERRORS = {"unavailable": SandboxUnavailableError, "crashed": SandboxCrashedError,
           "closed": SandboxClosedError, "untrusted_refused": UntrustedCodeRefusedError}


class RemoteSandbox(Sandbox):
    """Client of a ``loongsage sandbox serve`` service (which runs its own backend)."""

    params_type = RemoteParams
    backend = "remote"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        p = self.params
        self._token = p.token or os.environ.get(p.token_env)
        if not self._token:
            raise ConfigError(f"{self.key}.token", f"the remote sandbox needs the service's token: set "
                                                   f"{self.key}.token or the environment variable {p.token_env}")
        if not p.url.startswith(("http://", "https://")):
            raise ConfigError(f"{self.key}.url", f"must be an http(s) URL, got {p.url!r}")
        self._client: httpx.AsyncClient | None = None
        self._id: str | None = None
        self.service_limits: dict[str, Any] = {}

    def _requested_limits(self) -> dict[str, Any]:
        defaults = SandboxParams().limit_fields()
        return {k: v for k, v in self.params.limit_fields().items() if v != defaults[k]}

    async def _call(self, method: str, route: str, *, timeout: float = 30.0, **kwargs: Any) -> httpx.Response:
        try:
            resp = await self._client.request(method, route, timeout=timeout + self.params.request_timeout_s, **kwargs)
        except httpx.TransportError as err:
            raise SandboxUnavailableError(f"{self.key}.url: sandbox service at {self.params.url} "
                                          f"unreachable: {type(err).__name__}: {err}") from None
        if resp.status_code >= 400:
            try:
                body = resp.json()
            except ValueError:
                body = {"error": "error", "message": resp.text[:500]}
            kind, message = body.get("error", "error"), body.get("message", "")
            if kind == "config":
                key, _, problem = message.partition(": ")
                raise ConfigError(key, problem)
            if kind == "unauthorized":
                raise SandboxUnavailableError(f"{self.key}.token: the sandbox service rejected the token")
            if kind in _ERRORS:
                raise _ERRORS[kind](f"remote: {message}")
            raise SandboxError(f"remote: {message}", kind)
        return resp

    async def _start(self) -> None:
        self._client = httpx.AsyncClient(base_url=self.params.url.rstrip("/"),
                                         headers={"Authorization": f"Bearer {self._token}"})
        files = {p: base64.b64encode(d).decode() for p, d in self._state.files.items()}
        resp = await self._call("POST", "/sandboxes", json={
            "params": self._requested_limits(), "files": files, "untrusted": self.untrusted})
        body = resp.json()
        self._id, self.service_limits = body["id"], body.get("limits", {})

    async def _write_initial_files(self) -> None:
        """The service writes the initial files itself (at create and after each reset)."""

    async def _close(self) -> None:
        try:
            if self._id is not None:
                await self._call("DELETE", f"/sandboxes/{self._id}")
        except SandboxError:
            pass
        finally:
            if self._client is not None:
                await self._client.aclose()

    async def _reset(self) -> None:
        await self._call("POST", f"/sandboxes/{self._id}/reset")

    async def _exec(self, argv: list[str], stdin: bytes | None, timeout: float,
                    env: dict[str, str], cwd: str) -> ExecResult:
        resp = await self._call("POST", f"/sandboxes/{self._id}/exec", timeout=timeout, json={
            "argv": argv, "timeout": timeout, "env": env, "cwd": cwd,
            "stdin": base64.b64encode(stdin).decode() if stdin else None})
        return ExecResult.from_wire(resp.json())

    async def _write(self, path: str, data: bytes, mode: int) -> None:
        await self._call("PUT", f"/sandboxes/{self._id}/files", params={"path": path, "mode": mode}, content=data)

    async def _read(self, path: str, max_bytes: int) -> bytes:
        resp = await self._call("GET", f"/sandboxes/{self._id}/files", params={"path": path, "max_bytes": max_bytes})
        return resp.content

    async def _list(self, path: str) -> list[FileEntry]:
        resp = await self._call("GET", f"/sandboxes/{self._id}/list", params={"path": path})
        return [FileEntry(**e) for e in resp.json()["entries"]]

    def describe(self) -> str:
        return f"remote ({self.params.url})"
