"""``loongsage sandbox serve``: an HTTP service that runs sandboxes for ``remote`` clients.

Rollout workers on other machines create sandboxes here instead of locally. Every request
needs ``Authorization: Bearer <token>`` (compared in constant time); the service binds to
127.0.0.1 unless told otherwise. The backend is chosen when the service starts, by
registered name (default ``bwrap``); clients may only *lower* the shared limits
(``SandboxParams`` fields) below the service's own, never set backend fields such as
``ro_binds``, so a client cannot widen what the operator allowed. Sandboxes idle for longer
than ``idle_ttl_s`` (a client that crashed) are closed, and everything is closed when the
service stops; leftovers of a crashed service are removed at its next start.

Routes: ``GET /health``; ``POST /sandboxes``; ``POST /sandboxes/{id}/exec``;
``PUT|GET /sandboxes/{id}/files?path=`` (raw bytes); ``GET /sandboxes/{id}/list?path=``;
``POST /sandboxes/{id}/reset``; ``DELETE /sandboxes/{id}``. Errors are JSON
``{"error": kind, "message": text}`` with the kind the client turns back into an exception.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hmac
import time
import uuid
from typing import Any, AsyncIterator, Mapping

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from loongsage.plugin import ConfigError, LoongSageError

from loongsage_sandbox import leftovers
from loongsage_sandbox.base import Sandbox
from loongsage_sandbox.errors import SandboxError
from loongsage_sandbox.params import SandboxParams, coerce_params

LIMIT_FIELDS = {f.name for f in dataclasses.fields(SandboxParams)} - {"env"}
STATUS = {"not_found": 404, "closed": 404, "unauthorized": 401, "crashed": 500, "unavailable": 503,
          "busy": 429}


class _Held:
    def __init__(self, sandbox: Sandbox):
        self.sandbox = sandbox
        self.last_used = time.monotonic()


def _error(kind: str, message: str, status: int | None = None) -> JSONResponse:
    return JSONResponse({"error": kind, "message": message}, status_code=status or STATUS.get(kind, 400))


def create_app(factory: type[Sandbox], token: str, params: Mapping[str, Any] | None = None, *,
               max_sandboxes: int = 64, idle_ttl_s: float = 600.0) -> FastAPI:
    """The service's ASGI app: ``factory`` is a sandbox backend class (from the registry),
    ``params`` its config."""
    if not token:
        raise ConfigError("sandbox.serve.token", "a non-empty token is required")
    base = coerce_params(factory.params_type, params, "sandbox.serve")
    factory(base, untrusted=False, key="sandbox.serve")  # fail now if the backend cannot run here
    held: dict[str, _Held] = {}
    expected = f"Bearer {token}".encode()

    async def reap_idle() -> None:
        while True:
            await asyncio.sleep(min(idle_ttl_s, 30.0))
            now = time.monotonic()
            for sid, h in list(held.items()):
                if now - h.last_used > idle_ttl_s:
                    held.pop(sid, None)
                    await h.sandbox.close()

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        leftovers.cleanup_once()
        reaper = asyncio.ensure_future(reap_idle())
        try:
            yield
        finally:
            reaper.cancel()
            await asyncio.gather(*(h.sandbox.close() for h in held.values()), return_exceptions=True)
            held.clear()

    app = FastAPI(title="loongsage sandbox service", lifespan=lifespan)

    @app.middleware("http")
    async def auth(request: Request, call_next):
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            return _error("unauthorized", "missing or wrong bearer token")
        return await call_next(request)

    @app.exception_handler(SandboxError)
    async def sandbox_error(_request: Request, err: SandboxError) -> JSONResponse:
        return _error(err.kind, str(err))

    @app.exception_handler(ConfigError)
    async def config_error(_request: Request, err: ConfigError) -> JSONResponse:
        return _error("config", str(err))

    @app.exception_handler(LoongSageError)
    async def other_error(_request: Request, err: LoongSageError) -> JSONResponse:
        return _error("error", str(err))

    def get(sid: str) -> Sandbox:
        h = held.get(sid)
        if h is None:
            raise SandboxError(f"no sandbox '{sid}' (closed, expired after {idle_ttl_s:.0f} s idle, or never created)", "not_found")
        h.last_used = time.monotonic()
        return h.sandbox

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"backend": factory.backend, "sandboxes": len(held), "limits": base.limit_fields()}

    @app.post("/sandboxes")
    async def create(request: Request) -> Any:
        body = await request.json()
        requested = dict(body.get("params") or {})
        merged = dataclasses.replace(base)
        for name, value in requested.items():
            if name == "env":
                merged.env = {**base.env, **value}
                continue
            if name not in LIMIT_FIELDS:
                raise ConfigError(f"sandbox.{name}", f"not settable through the service; clients may set {sorted(LIMIT_FIELDS | {'env'})}")
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value > getattr(base, name):
                raise ConfigError(f"sandbox.{name}", f"{value!r} exceeds the service's limit {getattr(base, name)!r} (or is not a number)")
            setattr(merged, name, value)
        if len(held) >= max_sandboxes:
            return _error("busy", f"service holds its maximum of {max_sandboxes} sandboxes")
        files = {p: base64.b64decode(d) for p, d in (body.get("files") or {}).items()}
        sb = factory(merged, files=files, untrusted=bool(body.get("untrusted", True)))
        await sb.start()
        sid = uuid.uuid4().hex
        held[sid] = _Held(sb)
        return {"id": sid, "backend": factory.backend, "limits": merged.limit_fields()}

    @app.post("/sandboxes/{sid}/exec")
    async def exec_(sid: str, request: Request) -> Any:
        sb = get(sid)
        body = await request.json()
        stdin = base64.b64decode(body["stdin"]) if body.get("stdin") else None
        result = await sb.exec(body.get("argv") or [], stdin=stdin, timeout=body.get("timeout"),
                               env=body.get("env"), cwd=body.get("cwd") or ".")
        return result.to_dict()

    @app.put("/sandboxes/{sid}/files")
    async def write(sid: str, path: str, request: Request, mode: int = 0o644) -> Any:
        await get(sid).write_file(path, await request.body(), mode)
        return {"ok": True}

    @app.get("/sandboxes/{sid}/files")
    async def read(sid: str, path: str, max_bytes: int = 16 << 20) -> Response:
        return Response(await get(sid).read_file(path, max_bytes), media_type="application/octet-stream")

    @app.get("/sandboxes/{sid}/list")
    async def list_(sid: str, path: str = ".") -> Any:
        return {"entries": [dataclasses.asdict(e) for e in await get(sid).list_files(path)]}

    @app.post("/sandboxes/{sid}/reset")
    async def reset(sid: str) -> Any:
        await get(sid).reset()
        return {"ok": True}

    @app.delete("/sandboxes/{sid}")
    async def delete(sid: str) -> Any:
        h = held.pop(sid, None)
        if h is not None:
            await h.sandbox.close()
        return {"ok": True, "existed": h is not None}

    return app


def serve(backend: type[Sandbox], token: str, host: str = "127.0.0.1", port: int = 8765,
          params: Mapping[str, Any] | None = None, *, idle_ttl_s: float = 600.0,
          max_sandboxes: int = 64, ready: Any = None) -> None:
    """Run the service until interrupted; ``port=0`` picks a free port.

    ``ready(url)`` is called once the socket is bound (the CLI prints the URL with it).
    """
    import socket

    import uvicorn

    app = create_app(backend, token, params, max_sandboxes=max_sandboxes, idle_ttl_s=idle_ttl_s)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    if ready is not None:
        ready(f"http://{host}:{sock.getsockname()[1]}")
    # asyncio's own loop, not uvicorn's "auto" (uvloop where installed): the bubblewrap backend
    # drops to the host user with create_subprocess_exec(user=, group=, extra_groups=), which
    # uvloop refuses ("unexpected kwargs")
    config = uvicorn.Config(app, log_level="warning", lifespan="on", loop="asyncio")
    uvicorn.Server(config).run(sockets=[sock])
