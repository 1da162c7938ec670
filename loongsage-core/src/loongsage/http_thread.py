"""Serve an ASGI app with uvicorn in a background thread on a socket bound up front.

Binding the socket first makes ``port=0`` work (the OS picks a free port and the URL names it)
and makes a taken port fail at once with the address in the error. Used by the rollout
engine's HTTP server, the AgentFlow router and the trajectory viewer.
"""

from __future__ import annotations

import socket
import threading
from typing import Any


class ThreadedServer:
    """``start()`` returns the base URL once uvicorn accepts connections; ``stop()`` joins."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, name: str = "http",
                 **uvicorn_options: Any) -> None:
        self.app, self.host, self.port, self.name = app, host, port, name
        self.options = {"log_level": "warning", "access_log": False, **uvicorn_options}
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
