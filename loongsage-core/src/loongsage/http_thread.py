"""Serve an ASGI app with uvicorn in a background thread on a socket bound up front.

Binding the socket first makes ``port=0`` work (the OS picks a free port and the URL names it)
and makes a taken port fail at once with the address in the error. Used by the rollout
engine's HTTP server, the AgentFlow router and the trajectory viewer.

An idle keep-alive connection stays open for ``KEEP_ALIVE_S``, longer than any of our clients
keeps one for reuse (``engines.client.KEEPALIVE_EXPIRY_S``; httpx and Node's defaults are 5 s
and 4 s). uvicorn's own default, 5 s, equals httpx's: a client that reuses a connection at
the moment the server closes it gets a reset (``ReadError``) for a request the server never
read (a SmolLM2 tool-recipe run on a busy machine failed at step 0 on such a reset of /generate).

The servers parse HTTP with httptools (llhttp, Node's parser, in C) instead of h11, which cut
the AgentFlow router's CPU per turn at 64 concurrent sessions (``benchmarks/router.py``;
``docs/benchmarks.md``). Their event loop is asyncio's own, named so that uvicorn's ``auto`` never
picks uvloop where it happens to be installed: uvloop cut the router's CPU per turn further, but
on it anyio's client streams (httpx -> httpcore -> anyio, the router's calls to the engines) read
their socket from a transport that uvloop empties once the connection closes, so a call caught by
an engine restart failed with ``AttributeError: 'NoneType' object has no attribute
'getpeername'`` instead of a transport error the pool fails over on
(``tests/faults/test_router_sessions_restart.py``).
"""

from __future__ import annotations

import socket
import threading
from typing import Any

KEEP_ALIVE_S = 75.0  # seconds an idle client connection is kept (see the module docstring)


def header_timeout_protocol(seconds: float) -> type:
    """uvicorn's httptools protocol, closing a connection whose request headers are not all in
    within ``seconds`` of its opening or of the first byte of a request on a kept-alive one
    (uvicorn has no such limit: a client sending headers a byte at a time held a connection
    and its file descriptor forever). An idle kept-alive connection keeps ``KEEP_ALIVE_S``."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class HeaderTimeoutHttpTools(HttpToolsProtocol):
        _header_timer: Any = None
        _in_headers = True  # from the opening, and from a request's first byte, to its headers' end

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._time_headers()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)  # the parser calls on_message_begin / on_headers_complete
            self._time_headers()

        def on_message_begin(self) -> None:
            self._in_headers = True
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._in_headers = False
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_timer()
            super().connection_lost(exc)

        def _waiting(self) -> bool:
            return self._in_headers and not self.transport.is_closing()

        def _time_headers(self) -> None:
            if self._waiting() and self._header_timer is None:
                self._header_timer = self.loop.call_later(seconds, self._headers_late)
            elif not self._waiting():
                self._stop_timer()

        def _stop_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self._waiting():
                self.transport.close()

    return HeaderTimeoutHttpTools


class ThreadedServer:
    """``start()`` returns the base URL once uvicorn accepts connections; ``stop()`` joins."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, name: str = "http",
                 **uvicorn_options: Any) -> None:
        self.app, self.host, self.port, self.name = app, host, port, name
        self.options = {"log_level": "warning", "access_log": False, "timeout_keep_alive": KEEP_ALIVE_S,
                        "loop": "asyncio", "http": "httptools", **uvicorn_options}
        self.url: str | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        import uvicorn

        if self._server is not None:
            return self.url
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as err:
            sock.close()
            raise OSError(f"{self.name}: cannot listen on {self.host}:{self.port}: {err}") from None
        self._server = uvicorn.Server(uvicorn.Config(self.app, **self.options))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name=self.name, daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                self._server = None
                raise RuntimeError(f"{self.name} failed to start on {self.host}:{self.port}")
            threading.Event().wait(0.01)
        self.url = f"http://{self.host}:{sock.getsockname()[1]}"
        return self.url

    def stop(self, timeout: float = 10) -> None:
        if self._server is not None:
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(timeout=timeout)
        self._server = None
        self.url = None
