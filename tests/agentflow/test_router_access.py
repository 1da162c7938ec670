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
    from loongsage.plugins import get_registries

    monkeypatch.delenv(API_KEY_ENV, raising=False)
    with pytest.raises(ConfigError, match=r"^agentflow.api_key: the router binds '0.0.0.0'"):
        Router([EngineClient(engine_url)], tokenizer, get_registries(), RouterSettings(host="0.0.0.0"))
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    router = Router([EngineClient(engine_url)], tokenizer, get_registries(), RouterSettings(host="0.0.0.0"))
    assert router.tokens.api_key == "from-env"
    Router([EngineClient(engine_url)], tokenizer, get_registries(), RouterSettings(host="::1"))


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
