"""Fuzzing the router: whatever a client sends, it gets an error in its own wire format.

Hypothesis builds request bodies around a valid one (malformed JSON, wrong types, huge
values, unknown fields, broken tool-call payloads) and sends them over real HTTP to a real
router over the real embedded engine (tiny model). Every answer must be 200 or a 4xx whose
body is the caller's error format (OpenAI ``{"error": {...}}``, Anthropic ``{"type":
"error", ...}``), never a 500; after all of them, and after clients that leave mid-stream,
the engine has no request left running.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loongsage.engines.client import EngineClient

ENDPOINTS = {"chat/completions": "openai", "responses": "openai", "messages": "anthropic"}
ANY_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20),
                        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                        max_leaves=12)


def valid_body(api: str) -> dict:
    messages = [{"role": "user", "content": "1+1?"}]
    if api == "responses":
        return {"model": "policy", "input": "1+1?", "max_output_tokens": 2}
    return {"model": "policy", "messages": messages, "max_tokens": 2}


TOOL_CALL_MESSAGES = st.lists(st.fixed_dictionaries({
    "role": st.sampled_from(["assistant", "tool", "user", "system", "robot"]),
    "content": ANY_JSON,
    "tool_calls": st.lists(st.fixed_dictionaries({
        "id": ANY_JSON, "type": st.sampled_from(["function", "x"]),
        "function": st.fixed_dictionaries({"name": ANY_JSON, "arguments": ANY_JSON})}), max_size=2),
    "tool_call_id": ANY_JSON}), max_size=3)


@st.composite
def mutated(draw, api: str):
    """(raw bytes, description): a valid body with one kind of damage."""
    body = valid_body(api)
    kind = draw(st.sampled_from(["json", "type", "huge", "unknown", "tools", "any"]))
    if kind == "json":
        text = json.dumps(body)
        cut = draw(st.integers(0, len(text) - 1))
        return (text[:cut] + draw(st.text(max_size=5))).encode("utf-8", "surrogatepass"), kind
    if kind == "type":
        key = draw(st.sampled_from(sorted(body)))
        body[key] = draw(ANY_JSON)
    elif kind == "huge":
        key = draw(st.sampled_from(["max_tokens", "max_output_tokens", "temperature", "top_p", "n", "top_k"]))
        body[key] = draw(st.sampled_from([10**12, -10**12, 2**63, 1e308, float("nan"), -1]))
    elif kind == "unknown":
        body[draw(st.text(min_size=1, max_size=12))] = draw(ANY_JSON)
    elif kind == "tools":
        body["messages" if api != "responses" else "input"] = draw(TOOL_CALL_MESSAGES)
        body["tools"] = draw(st.lists(ANY_JSON, max_size=2))
    else:
        body = draw(ANY_JSON)
    try:
        return json.dumps(body, allow_nan=True).encode(), kind
    except (TypeError, ValueError):
        return b"{", kind


def in_wire_format(api: str, payload: dict) -> bool:
    if ENDPOINTS[api] == "anthropic":
        return payload.get("type") == "error" and isinstance(payload.get("error", {}).get("message"), str)
    return isinstance(payload.get("error"), dict) and isinstance(payload["error"].get("message"), str)


@pytest.fixture(scope="module")
def fuzz_router(tokenizer, engine_url):
    from loongsage.agentflow.server import Router
    from loongsage.agentflow.settings import RouterSettings
    from loongsage.config.router_plugins import resolve_router_plugins
    from loongsage.plugins import get_registries

    settings = RouterSettings(auto_create_trajectories=True, default_max_tokens=4)
    settings = settings.with_plugins(resolve_router_plugins(get_registries()))
    router = Router([EngineClient(engine_url)], tokenizer, settings)
    router.start()
    yield router
    router.stop()


@pytest.mark.parametrize("api", sorted(ENDPOINTS))
def test_any_body_gets_an_answer_in_the_callers_format_never_a_500(fuzz_router, api):
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(mutated(api))
    def check(case):
        raw, kind = case
        resp = httpx.post(f"{fuzz_router.url}/v1/{api}", content=raw, timeout=60,
                          headers={"content-type": "application/json", "authorization": "Bearer fuzz:0"})
        assert resp.status_code < 500, (kind, raw[:300], resp.text[:300])
        if resp.status_code != 200:
            assert in_wire_format(api, resp.json()), (kind, raw[:300], resp.text[:300])

    check()


def test_clients_leaving_mid_stream_leave_no_engine_request(fuzz_router, engine_url):
    body = {"model": "policy", "messages": [{"role": "user", "content": "count"}], "max_tokens": 200,
            "stream": True}
    for i in range(5):
        with httpx.stream("POST", f"{fuzz_router.url}/v1/chat/completions", json=body, timeout=60,
                          headers={"authorization": f"Bearer leave{i}:0"}) as resp:
            assert resp.status_code == 200
            next(resp.iter_lines())  # the first chunk arrived: leave now
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and running_requests(engine_url):
        time.sleep(0.2)
    assert running_requests(engine_url) == 0


def running_requests(engine_url: str) -> int:
    load = httpx.get(f"{engine_url}/get_load", timeout=10).json()
    return int(load["running"]) + int(load["waiting"])
