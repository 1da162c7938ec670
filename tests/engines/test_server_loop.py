"""Our HTTP servers (engine, AgentFlow router, viewer) run on uvloop's event loop.

A real ``ThreadedServer`` answers a request from inside its loop with that loop's type: uvloop's,
named explicitly in ``http_thread`` (uvicorn's ``auto`` would fall back to asyncio's own loop
without a word where uvloop is missing, and the router's CPU per turn would rise with it).
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
    return JSONResponse({"module": type(loop).__module__, "name": type(loop).__name__})


def test_threaded_server_serves_on_uvloop():
    server = ThreadedServer(Starlette(routes=[Route("/", loop_type)]), name="loop-test")
    url = server.start()
    try:
        got = httpx.get(url + "/", timeout=10).json()
    finally:
        server.stop()
    assert got == {"module": "uvloop", "name": "Loop"}
