"""``EngineClient`` against the embedded engine over real HTTP (uvicorn on 127.0.0.1): SGLang
wire shapes, streaming, sync/async parity, error mapping, and the wire-format tolerance for
SGLang variants (incremental stream chunks, replies without top-level ``output_ids``), the
latter checked against a small real HTTP server that answers the way those SGLang versions do
(no SGLang can run on a CPU-only machine; docs/backends.md)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from loongsage.engines.client import EngineClient
from loongsage.engines.replies import EngineError

PROMPT = [11, 22, 33, 44]
GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(running_engine, tiny_model_dir):
    with running_engine(tiny_model_dir, seed=5) as eng:
        yield eng


@pytest.fixture(scope="module")
def client(engine):
    with EngineClient(engine.url, timeout=60) as c:
        yield c


def test_generate_reply_has_sglang_shape(engine):
    body = {"input_ids": PROMPT, "sampling_params": GREEDY, "return_logprob": True, "rid": "r1"}
    out = httpx.post(engine.url + "/generate", json=body).json()
    meta = out["meta_info"]
    assert meta["id"] == "r1" and meta["finish_reason"] == {"type": "length", "length": 12}
    assert meta["prompt_tokens"] == 4 and meta["completion_tokens"] == 12
    assert meta["weight_version"] == "0"
    assert [t for _, t, _ in meta["output_token_logprobs"]] == out["output_ids"]
    assert all(lp <= 0 and text is None for lp, _, text in meta["output_token_logprobs"])
    assert isinstance(out["text"], str) and out["text"]  # the tiny model ships a tokenizer
    no_lp = httpx.post(engine.url + "/generate", json={**body, "return_logprob": False}).json()
    assert "output_token_logprobs" not in no_lp["meta_info"]
    assert no_lp["output_ids"] == out["output_ids"]


def test_batched_input_ids_give_a_list_of_replies(engine, client):
    prompts = [PROMPT, [7, 8]]
    outs = httpx.post(engine.url + "/generate", json={
        "input_ids": prompts, "sampling_params": GREEDY, "rid": ["a", "b"]}).json()
    assert [o["meta_info"]["id"] for o in outs] == ["a", "b"]
    assert [o["output_ids"] for o in outs] == [client.generate(p, GREEDY).output_ids for p in prompts]


def test_text_prompt_is_tokenized_like_the_tokenizer(engine, client):
    ids = engine.tokenizer("12 + 30 =")["input_ids"]
    by_text = httpx.post(engine.url + "/generate",
                         json={"text": "12 + 30 =", "sampling_params": GREEDY}).json()
    assert by_text["output_ids"] == client.generate(ids, GREEDY).output_ids


def test_sync_and_async_generate_agree(client):
    sync = client.generate(PROMPT, GREEDY, rid="sync-1")
    a1 = asyncio.run(client.agenerate(PROMPT, GREEDY))
    a2 = asyncio.run(client.agenerate(PROMPT, GREEDY))  # a second event loop: fresh AsyncClient
    assert sync.rid == "sync-1" and len(sync.output_ids) == 12 and sync.finish_reason == "length"
    assert a1.output_ids == a2.output_ids == sync.output_ids
    assert a1.output_logprobs == pytest.approx(sync.output_logprobs, abs=1e-6)
    assert sync.prompt_tokens == 4 and sync.completion_tokens == 12
    assert sync.output_weight_versions == [0] * 12 and sync.weight_version == 0


def test_stream_chunks_concatenate_to_the_full_generation(engine, client):
    full = client.generate(PROMPT, {**GREEDY, "max_new_tokens": 30})

    async def collect():
        return [c async for c in client.astream_generate(PROMPT, {**GREEDY, "max_new_tokens": 30})]

    chunks = asyncio.run(collect())
    assert len(chunks) > 1 and [c.finished for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert sum((c.output_ids for c in chunks), []) == full.output_ids
    assert sum((c.output_logprobs for c in chunks), []) == pytest.approx(full.output_logprobs, abs=1e-6)
    assert "".join(c.text for c in chunks) == full.text
    assert chunks[-1].finish_reason == "length"


def test_stream_wire_format_is_sse_ending_with_done(engine):
    body = {"input_ids": PROMPT, "sampling_params": {**GREEDY, "max_new_tokens": 5}, "stream": True}
    with httpx.stream("POST", engine.url + "/generate", json=body) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in resp.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]" and all(ln.startswith("data: ") for ln in lines)
    last = json.loads(lines[-2][len("data: "):])
    assert len(last["output_ids"]) == 5 and last["meta_info"]["finish_reason"]["type"] == "length"


def test_control_endpoints(engine, client):
    assert client.health() and asyncio.run(client.ahealth())
    info = client.get_model_info()
    assert info["is_generation"] and info["model_path"] == engine.model_path
    assert client.get_weight_version() == 0
    assert client.flush_cache() is True
    client.pause_generation()
    assert httpx.get(engine.url + "/get_server_info").json()["paused"] is True
    client.continue_generation()
    assert httpx.get(engine.url + "/get_server_info").json()["paused"] is False
    client.abort("no-such-rid")  # SGLang treats an unknown rid as a no-op
    with pytest.raises(ValueError, match="abort_all"):
        client.abort()


def test_errors_name_endpoint_status_and_field(client):
    with pytest.raises(EngineError) as err:
        client.generate(PROMPT, {"top_p": 1.5})
    assert err.value.status == 400 and err.value.field == "sampling_params.top_p"
    assert "/generate" in str(err.value) and "top_p" in str(err.value)

    async def stream_bad():
        async for _ in client.astream_generate(PROMPT, {"temperature": -2}):
            pass

    with pytest.raises(EngineError, match="temperature"):
        asyncio.run(stream_bad())


def test_unreachable_engine_raises_and_health_is_false():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    dead = EngineClient(f"http://127.0.0.1:{port}", timeout=2)
    assert dead.health() is False
    with pytest.raises(EngineError, match="unreachable"):
        dead.generate(PROMPT, GREEDY)
    with pytest.raises(EngineError, match="not healthy"):
        dead.wait_until_healthy(timeout=0.3)


@pytest.fixture(scope="module")
def sglang_variant():
    """A real HTTP server answering like SGLang with ``--stream-output`` (incremental chunks)
    and without top-level ``output_ids``, finishing with a string version and ``matched``."""
    app = FastAPI()
    toks = [(-0.5, 9), (-1.25, 4), (-0.75, 2)]

    def meta(upto, done):
        return {"id": "v", "prompt_tokens": 3, "completion_tokens": upto,
                "weight_version": "default",
                "finish_reason": {"type": "stop", "matched": 2} if done else None}

    @app.post("/generate")
    async def generate(body: dict):
        if not body.get("stream"):
            return {"text": "abc", "meta_info": {**meta(3, True), "output_token_logprobs":
                                                 [[lp, t, None] for lp, t in toks]}}

        async def events():
            for i, (lp, t) in enumerate(toks):
                chunk = {"text": "x", "meta_info": {**meta(i + 1, i == 2),
                                                    "output_token_logprobs": [[lp, t, None]]}}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        threading.Event().wait(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(5)


def test_client_tolerates_sglang_wire_variants(sglang_variant):
    c = EngineClient(sglang_variant)
    out = c.generate([1, 2, 3], {"max_new_tokens": 3})
    assert out.output_ids == [9, 4, 2] and out.output_logprobs == [-0.5, -1.25, -0.75]
    assert out.finish_reason == "stop" and out.matched_stop == 2
    assert out.weight_version == "default" and out.output_weight_versions is None

    async def collect():
        return [ch async for ch in c.astream_generate([1, 2, 3], {"max_new_tokens": 3})]

    chunks = asyncio.run(collect())
    assert [ch.output_ids for ch in chunks] == [[9], [4], [2]]
    assert "".join(ch.text for ch in chunks) == "xxx" and chunks[-1].finish_reason == "stop"
