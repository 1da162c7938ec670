"""Cache-aware routing in the engine pool and the step's prefix-cache metrics.

Two real embedded engines (tiny model) behind one ``EnginePool``: a trajectory stays on its
replica; a new session or a request without one goes to the replica that was sent the
longest prefix of its prompt, and that engine's reply shows the cache hit, unless that
replica is busier than the least-loaded one by more than ``prefix_slack``. The metrics
``rollout/prefill_tokens`` and ``rollout/prefix_cache_hit_ratio`` come from the replies'
``meta_info.cached_tokens``, which a real SGLang server reports as well; SGLang cannot run
here (no CUDA), so its test uses a fake ``/generate`` on loopback that answers in SGLang's
format with SGLang's radix-cache count (the longest common prefix with an earlier prompt).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from loongsage.controller.rollout import RolloutManager
from loongsage.engines.client import EngineClient
from loongsage.engines.pool import EnginePool
from loongsage.engines.prefix_index import BLOCK, PrefixIndex
from loongsage.http_thread import ThreadedServer

SAMPLING = {"max_new_tokens": 3, "temperature": 0.0}
P = list(range(30, 30 + 3 * BLOCK))  # 48 tokens: three blocks
Q = list(range(200, 200 + 3 * BLOCK))


def test_the_index_matches_whole_blocks_of_a_common_prefix():
    index = PrefixIndex(capacity=4)
    index.record(P + [1, 2])
    assert index.match(P + [9]) == 3 * BLOCK and index.match(P[:BLOCK + 3]) == BLOCK
    assert index.match(P[1:]) == 0  # a key covers every token before it
    index.record(Q)  # three more keys: two of P's go, its first (used last) stays
    assert index.match(P) == BLOCK and index.match(Q) == 3 * BLOCK


@pytest.fixture(scope="module")
def two_engines(running_engine, tiny_model_dir):
    with running_engine(tiny_model_dir) as first, running_engine(tiny_model_dir) as second:
        yield [first.url, second.url]


def manager(pool: EnginePool) -> RolloutManager:
    return RolloutManager({}, pool, loop=None, n_samples=1, sampling_params={}, scorer=None)


async def turn(pool: EnginePool, key: str, prompt: list[int]):
    """One session turn as the AgentFlow router sends it: its replica, a slot there, the request."""
    idx = pool.pick(key, prompt)
    async with pool.slot(idx) as slot:
        return idx, await slot.client.agenerate(prompt, SAMPLING)


def test_new_sessions_go_where_their_prefix_is_cached(two_engines):
    pool = EnginePool([EngineClient(url) for url in two_engines])
    rollout = manager(pool)

    async def script():
        a, first = await turn(pool, "a", P)  # nothing cached anywhere: least-loaded, replica 0
        b, _ = await turn(pool, "b", Q)  # replica 0 holds a session now: replica 1
        c, same = await turn(pool, "c", Q + [7, 8])  # a tie on load would pick 0; Q is on 1
        a2, second = await turn(pool, "a", P + first.output_ids + [9])  # sticky, cached there
        d = pool.pick("d", P + [3])  # streamed: counted from its last chunk
        async with pool.slot(d) as slot:
            chunks = [chunk async for chunk in slot.client.astream_generate(P + [3], SAMPLING)]
        return (a, b, c, a2, d), same, second, chunks

    replicas, same, second, chunks = asyncio.run(script())
    assert replicas == (0, 1, 1, 0, 0) and pool.sessions == [2, 2] and chunks[-1].finished
    assert same.meta_info["cached_tokens"] == len(Q)  # served from replica 1's cache
    assert second.meta_info["cached_tokens"] == len(P) + SAMPLING["max_new_tokens"] - 1
    submitted = 2 * len(P) + 2 * len(Q) + 2 + SAMPLING["max_new_tokens"] + 1 + len(P) + 1
    cached = len(Q) + len(P) + SAMPLING["max_new_tokens"] - 1 + len(P)
    metrics = rollout.engine_metrics()
    assert metrics["rollout/prefill_tokens"] == submitted - cached
    assert metrics["rollout/prefix_cache_hit_ratio"] == pytest.approx(cached / submitted)
    assert "rollout/prefill_tokens" not in rollout.engine_metrics()  # counted once, then reset


def test_load_overrides_the_cache_beyond_the_slack(two_engines):
    """Replica 1 holds the prefix; with more than ``prefix_slack`` requests in flight there
    than on replica 0, a new request goes to replica 0 (and a batch without a session too)."""
    pool = EnginePool([EngineClient(url) for url in two_engines], prefix_slack=2)

    async def script():
        pool.prefixes[1].record(Q)
        async with pool.slot(1, prompts=2):  # two in flight on replica 1: within the slack
            near = pool.choose(Q + [1])
        async with pool.slot(1, prompts=3):  # three: beyond it
            far = pool.choose(Q + [2])
            [out] = await pool.agenerate_batch([P], SAMPLING)
        return near, far, out

    near, far, out = asyncio.run(script())
    assert (near, far) == (1, 0)
    assert pool.take_served() == [1, 5]  # the batch went to replica 0
    assert pool.prefixes[0].match(P + out.output_ids) == 3 * BLOCK


def test_a_short_shared_prefix_does_not_pull_sessions_together():
    """Half the prompt must be held: a shared system prompt (one block of three) leaves a new
    session to the least-loaded replica; no request is sent."""
    pool = EnginePool([EngineClient("http://127.0.0.1:9"), EngineClient("http://127.0.0.1:9")])
    pool.prefixes[0].record(P)
    pool.sessions[0] = 1  # replica 0 holds a session already: least-loaded is replica 1
    assert pool.pick("long", P[:2 * BLOCK] + Q[2 * BLOCK:]) == 0  # two blocks of three held there
    assert pool.pick("short", P[:BLOCK] + Q[BLOCK:]) == 1


@pytest.fixture
def fake_sglang():
    """A stand-in for SGLang's ``/generate`` (SGLang needs CUDA): answers in its format, with
    ``cached_tokens`` as its radix cache counts them (page size 1)."""
    seen: list[list[int]] = []

    async def generate(request):
        body = json.loads(await request.body())
        ids = body["input_ids"]
        cached = max((next((i for i, (x, y) in enumerate(zip(ids, old)) if x != y), min(len(ids), len(old)))
                      for old in seen), default=0)
        seen.append(ids)
        return JSONResponse({"text": "x", "output_ids": [5], "meta_info": {
            "id": body["rid"], "finish_reason": {"type": "length", "length": 1},
            "prompt_tokens": len(ids), "completion_tokens": 1, "cached_tokens": min(cached, len(ids) - 1),
            "weight_version": "default", "output_token_logprobs": [[-0.5, 5, None]]}})

    server = ThreadedServer(Starlette(routes=[Route("/generate", generate, methods=["POST"])]),
                            name="fake-sglang")
    url = server.start()
    yield url
    server.stop()


def test_sglangs_cached_tokens_give_the_same_metrics(fake_sglang):
    pool = EnginePool([EngineClient(fake_sglang)])
    rollout = manager(pool)

    async def script():
        await pool.agenerate(P, SAMPLING)
        await pool.agenerate(P + [1, 2], SAMPLING)
        await EngineClient(fake_sglang).agenerate(P, SAMPLING)  # a client outside the pool: not counted

    asyncio.run(script())
    metrics = rollout.engine_metrics()
    assert metrics["rollout/prefill_tokens"] == len(P) + 2
    assert metrics["rollout/prefix_cache_hit_ratio"] == pytest.approx(len(P) / (2 * len(P) + 2))
