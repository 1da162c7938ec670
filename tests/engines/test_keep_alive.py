"""Idle keep-alive connections: our HTTP servers keep one open longer than our client reuses it.

A real ``ThreadedServer`` (uvicorn) and a raw HTTP/1.1 connection: after the connection sat
idle past uvicorn's own 5 s default, a second request on it must still be answered (with the
old default the server had closed it, and a client reusing it right then got a reset for a
request the server never read). The engine client drops idle connections well before that.
"""

from __future__ import annotations

import http.client
import time

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from loongsage.engines.client import KEEPALIVE_EXPIRY_S, EngineClient
from loongsage.http_thread import KEEP_ALIVE_S, ThreadedServer


async def hello(request):
    return JSONResponse({"ok": True})


def test_an_idle_connection_outlives_uvicorns_default_and_the_clients_expiry():
    server = ThreadedServer(Starlette(routes=[Route("/", hello)]), name="keep-alive-test")
    url = server.start()
    try:
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("GET", "/")
        first = conn.getresponse()
        assert first.status == 200 and first.read() == b'{"ok":true}'
        time.sleep(6.0)  # past uvicorn's default timeout_keep_alive (5 s)
        conn.request("GET", "/")  # the same socket: http.client reconnects only if told to
        second = conn.getresponse()
        assert second.status == 200 and second.read() == b'{"ok":true}'
        conn.close()
    finally:
        server.stop()
    assert KEEPALIVE_EXPIRY_S < 5.0 < KEEP_ALIVE_S  # SGLang's uvicorn closes at 5 s, ours later
    client = EngineClient("http://127.0.0.1:1")
    assert client.limits.keepalive_expiry == KEEPALIVE_EXPIRY_S
    client.close()
