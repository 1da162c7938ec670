"""Our HTTP servers (engine, AgentFlow router, viewer) run on asyncio's own event loop, even
where uvloop is installed (uvicorn's ``auto`` would pick it).

On uvloop, anyio's client streams (the router's httpx calls to the engines) lose their socket
once a connection closes, and a call caught by an engine restart failed with an
``AttributeError`` instead of a transport error the pool fails over on (``http_thread``'s
docstring). A real ``ThreadedServer`` answers with the type of the loop it runs on.
"""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from loongsage.http_thread import ThreadedServer


async def loop_type(request):
    loop = asyncio.get_running_loop()
    return JSONResponse({"module": type(loop).__module__, "asyncio": isinstance(loop, asyncio.BaseEventLoop)})


def test_threaded_server_serves_on_asyncios_own_loop():
    server = ThreadedServer(Starlette(routes=[Route("/", loop_type)]), name="loop-test")
    url = server.start()
    try:
        got = httpx.get(url + "/", timeout=10).json()
    finally:
        server.stop()
    assert got == {"module": "asyncio.unix_events", "asyncio": True}
