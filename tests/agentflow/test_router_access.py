"""A router safe to expose: non-loopback binds need an API key, agents then name their
trajectory by an issued token (a guessed id is refused), listings need the key, and
request bodies are capped. Real routers on loopback over the real embedded engine."""

from __future__ import annotations

import httpx
import pytest

from loongsage.agentflow.access import API_KEY_ENV
from loongsage.engines.client import EngineClient
from loongsage.errors import ConfigError

CHAT = {"model": "policy", "messages": [{"role": "user", "content": "1+1?"}], "max_tokens": 2}


def test_a_non_loopback_bind_needs_an_api_key(tokenizer, engine_url, monkeypatch):
    from loongsage.agentflow.server import Router
    from loongsage.agentflow.settings import RouterSettings

    monkeypatch.delenv(API_KEY_ENV, raising=False)
    with pytest.raises(ConfigError, match=r"^agentflow.api_key: the router binds '0.0.0.0'"):
        Router([EngineClient(engine_url)], tokenizer, RouterSettings(host="0.0.0.0"))
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    router = Router([EngineClient(engine_url)], tokenizer, RouterSettings(host="0.0.0.0"))
    assert router.tokens.api_key == "from-env"
    Router([EngineClient(engine_url)], tokenizer, RouterSettings(host="::1"))


def test_with_a_key_trajectories_are_reached_by_their_token_only(make_router, engine_url):
    router = make_router([EngineClient(engine_url)], api_key="secret")
    for tid in ("t1", "t2"):
        router.open_trajectory(tid)
    key = router.trajectory_key("t1")
    token = key.split(":")[0]
    assert token not in ("t1", "t2") and len(token) >= 20 and router.trajectory_key("t2") != key
    guessed = httpx.post(f"{router.url}/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer t2:0"})
    assert guessed.status_code == 401 and guessed.json()["error"]["type"] == "authentication_error"
    by_path = httpx.post(f"{router.url}/t2/0/v1/messages", json=CHAT)
    assert by_path.status_code == 401 and by_path.json()["type"] == "error"
    ok = httpx.post(f"{router.url}/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {key}"})
    assert ok.status_code == 200, ok.text
    assert router.base_urls("t1")["openai"] == f"{router.url}/{token}/0/v1"
    ok = httpx.post(router.base_urls("t1")["openai"] + "/chat/completions", json=CHAT)
    assert ok.status_code == 200
    assert len(router.store.lookup("t1").segments) >= 1 and not router.store.lookup("t2").tokens
    assert httpx.get(f"{router.url}/v1/trajectories").status_code == 401
    listing = httpx.get(f"{router.url}/v1/trajectories", headers={"authorization": "Bearer secret"})
    assert {t["trajectory_id"] for t in listing.json()["trajectories"]} == {"t1", "t2"}
    router.finish_trajectory("t1")
    gone = httpx.post(f"{router.url}/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {key}"})
    assert gone.status_code == 401  # a finished trajectory's token is revoked


def test_bodies_past_the_cap_are_refused_in_the_callers_format(make_router, engine_url):
    router = make_router([EngineClient(engine_url)], max_body_bytes=1000, auto_create_trajectories=True)
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]}
    headers = {"authorization": "Bearer big:0"}
    openai = httpx.post(f"{router.url}/v1/chat/completions", json=big, headers=headers)
    assert openai.status_code == 413 and "exceeds the router's limit of 1000" in openai.json()["error"]["message"]
    claude = httpx.post(f"{router.url}/v1/messages", json=big, headers=headers)
    assert claude.status_code == 413 and claude.json()["error"]["type"] == "request_too_large"

    def chunks():  # no content-length: the cap applies while reading
        for _ in range(4):
            yield b" " * 400

    streamed = httpx.post(f"{router.url}/v1/chat/completions", content=chunks(), headers=headers)
    assert streamed.status_code == 413
    assert httpx.post(f"{router.url}/v1/chat/completions", json=CHAT, headers=headers).status_code == 200


def test_a_served_router_with_a_key_accepts_its_own_key_and_its_printed_urls(engine_url):
    """``loongsage serve`` with ``agentflow.api_key``: before, the key holder got 401 both with
    ``Authorization: Bearer <key>`` and on the URL the router printed."""
    import io
    import re

    from loongsage.config.compose import load_config
    from loongsage.controller.serve import serve

    from loongsage.models.resolve import resolve_model_path

    run = load_config("tiny/grpo", ["agentflow.api_key=secret"])
    run.cfg.model.path = str(resolve_model_path(run.cfg.model.path))
    out = io.StringIO()
    router = serve(run, [engine_url], block=False, out=out)
    try:
        printed = re.search(r"OPENAI_BASE_URL=(\S+) ANTHROPIC_BASE_URL=(\S+)", out.getvalue()).groups()
        assert "/demo/" not in printed[0]  # an issued token, not the guessable id
        assert "Authorization: Bearer <key>" in out.getvalue()
        as_printed = httpx.post(printed[0] + "/chat/completions", json=CHAT)
        assert as_printed.status_code == 200, as_printed.text
        claude = httpx.post(printed[1] + "/v1/messages", json=CHAT, headers={"x-api-key": "anything"})
        assert claude.status_code == 200, claude.text
        key = {"authorization": "Bearer secret"}
        by_id = httpx.post(f"{router.url}/mine/0/v1/chat/completions", json=CHAT, headers=key)
        assert by_id.status_code == 200, by_id.text
        no_path = httpx.post(f"{router.url}/v1/chat/completions", json=CHAT, headers=key)
        assert no_path.status_code == 200, no_path.text
        listing = httpx.get(f"{router.url}/v1/trajectories", headers=key).json()["trajectories"]
        assert {t["trajectory_id"] for t in listing} == {"demo", "mine", "default"}
        wrong = httpx.post(f"{router.url}/mine/0/v1/chat/completions", json=CHAT,
                           headers={"authorization": "Bearer not-the-key"})
        assert wrong.status_code == 401  # still: a bare id without the key is refused
        assert httpx.post(f"{router.url}/mine/0/v1/chat/completions", json=CHAT).status_code == 401
    finally:
        router.stop()


def _raw(url: str):
    import socket

    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def _reply(sock) -> str:
    """The whole response on ``sock``: headers and the body ``Content-Length`` says (they may
    arrive in separate reads)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(next((line.split(b":", 1)[1] for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), b"0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return (head + b"\r\n\r\n" + body).decode()


def _closed_after(sock) -> float:
    """Seconds until the server closes ``sock`` (what it sent before closing is ignored)."""
    import time

    start = time.monotonic()
    while sock.recv(4096):
        pass
    return time.monotonic() - start


def test_connections_sending_headers_slowly_are_closed(make_router, engine_url):
    """Before, uvicorn held a connection that never finished its headers for ever."""
    router = make_router([EngineClient(engine_url)], auto_create_trajectories=True, header_timeout_s=1.0)
    silent = _raw(router.url)
    trickling = _raw(router.url)
    trickling.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\n")  # the rest never comes
    assert _closed_after(silent) < 10 and _closed_after(trickling) < 10
    reused = httpx.Client()  # a prompt client on a kept-alive connection is not affected
    for _ in range(2):
        ok = reused.post(f"{router.url}/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer k:0"})
        assert ok.status_code == 200


def test_a_body_sent_too_slowly_is_refused_with_408(make_router, engine_url):
    router = make_router([EngineClient(engine_url)], auto_create_trajectories=True, body_timeout_s=1.0)
    sock = _raw(router.url)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nAuthorization: Bearer k:0\r\n"
                 b"Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"model\": ")
    reply = _reply(sock)
    assert reply.startswith("HTTP/1.1 408"), reply
    assert "request body not received whole within the router's 1 s (agentflow.body_timeout_s)" in reply
