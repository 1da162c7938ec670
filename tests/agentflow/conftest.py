"""AgentFlow fixtures: the tiny model's tokenizer, a real embedded engine, routers on loopback,
real engine servers in processes of their own (``engine_servers``: to be SIGKILLed), and a
scripted engine replica.

The scripted replica (``scripted_engine``):
The tiny test model has random weights: it never emits a tool call, never fails on purpose
and cannot be made slow on demand. ``ScriptedEngine`` stands in for ``EngineClient`` in
exactly those tests: it answers with the real tokenizer's ids of a scripted reply (plus the
end-of-turn token) and fixed logprobs, streams them one token per chunk, can raise part-way
through a stream, and records aborts. Everything else in those tests (router, adapters,
SDK clients, TITO, store) is real.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from loongsage.engines.replies import GenerateOutput, StreamChunk

from loongsage.agentflow.server import Router
from loongsage.config.router_plugins import DEFAULT_TOOL_PARSER, resolve_router_plugins
from loongsage.plugins import get_registries
from loongsage.agentflow.settings import RouterSettings


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def engine_url(running_engine, tiny_model_dir):
    with running_engine(tiny_model_dir, num_threads=0) as engine:  # 0: torch's own thread count
        yield engine.url


@pytest.fixture
def make_router(tokenizer):
    """Start routers over the given engines; every router is stopped after the test."""
    started: list[Router] = []

    def make(engines, registries=None, tool_parser=DEFAULT_TOOL_PARSER, middlewares=None, **settings) -> Router:
        """``tool_parser`` and ``middlewares`` are resolved first, as config validation does."""
        registries = registries if registries is not None else get_registries()
        plugins = resolve_router_plugins(registries, tool_parser, middlewares)
        router = Router(engines, tokenizer, RouterSettings(**settings).with_plugins(plugins))
        router.start()
        started.append(router)
        return router

    yield make
    for router in started:
        router.stop()


@pytest.fixture
def router(make_router, engine_url):
    """A router over the real embedded engine (tiny model)."""
    from loongsage.engines.client import EngineClient

    return make_router([EngineClient(engine_url)])

class EngineServer:
    """An embedded rollout engine serving in a process of its own and its own session, started
    with SGLang's argv (``sglang_compat``, as the SGLang launcher tests start it)."""

    def __init__(self, model_dir: Path, weight_version: int = 0) -> None:
        from loongsage.engines.client import EngineClient

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "loongsage.engines.embedded_rollout.sglang_compat", "--model-path",
             str(model_dir), "--port", str(port), "--weight-version", str(weight_version),
             "--skip-server-warmup"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"})
        self.url = f"http://127.0.0.1:{port}"
        self.client = EngineClient(self.url)
        try:
            self.client.wait_until_healthy(120)
        except BaseException:
            self.kill()
            raise

    def load(self) -> dict:
        """The engine's ``/get_load``: requests running and waiting."""
        return httpx.get(self.url + "/get_load", timeout=5).json()

    def kill(self) -> None:
        """SIGKILL, as a crashed engine dies; reaped."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def engine_servers(tiny_model_dir):
    """``engine_servers(weight_version=0) -> EngineServer`` (tiny model); all killed after the module."""
    started: list[EngineServer] = []

    def start(weight_version: int = 0) -> EngineServer:
        started.append(EngineServer(tiny_model_dir, weight_version))
        return started[-1]

    yield start
    for server in started:
        server.kill()


LOGPROB = -0.25
VERSION = 3


class ScriptedEngine:
    """Stands in for ``EngineClient`` where the random tiny model cannot (see module docstring)."""

    def __init__(self, tokenizer: Any, replies: list[str], fail_after: int | None = None,
                 delay: float = 0.0) -> None:
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.fail_after = fail_after
        self.delay = delay
        self.prompts: list[list[int]] = []
        self.aborted: list[str] = []
        self.running = self.max_running = 0  # concurrent streams now / at most
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def _ids(self, input_ids: list[int]) -> list[int]:
        self.prompts.append(list(input_ids))
        reply = self.replies.pop(0)
        return self.tokenizer.encode(reply, add_special_tokens=False) + [self.eos]

    async def agenerate(self, input_ids, sampling_params=None, *, return_logprob=True, rid=None):
        ids = self._ids(input_ids)
        if self.fail_after is not None:
            raise RuntimeError("scripted engine failure")
        return GenerateOutput(ids, [LOGPROB] * len(ids), "stop", VERSION, len(input_ids), rid or "")

    async def astream_generate(self, input_ids, sampling_params=None, *, return_logprob=True, rid=None):
        ids = self._ids(input_ids)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            for i, tok in enumerate(ids):
                if self.fail_after is not None and i == self.fail_after:
                    raise RuntimeError("scripted engine failure")
                await asyncio.sleep(self.delay)
                last = i == len(ids) - 1
                yield StreamChunk([tok], [LOGPROB], "", last, "stop" if last else None, VERSION, rid or "")
        finally:
            self.running -= 1

    async def aabort(self, rid=None, *, abort_all=False):
        self.aborted.append(rid)


@pytest.fixture
def scripted_engine(tokenizer):
    """``scripted_engine(replies, fail_after=None, delay=0.0) -> ScriptedEngine``."""
    return lambda replies, **kw: ScriptedEngine(tokenizer, replies, **kw)
