"""verifiers' training client against the router: ``TrainClient`` (verifiers 0.4.0,
``verifiers.v1.clients.train``; what ``--client.type train`` and prime-rl's orchestrator use)
renders each turn to token ids itself and posts them to ``/inference/v1/generate``, through the
real ``renderers.client.generate``. The router samples each turn on the real embedded engine
(tiny model) and records it; the tests check that the router's training samples hold, token for
token, the prompts the client sent and the completions and logprobs it got back.

Turns are driven the way verifiers' interception server drives them
(``graph.prepare_turn`` -> ``TrainClient.get_response`` -> ``turn.commit``), with the rollout's
trace id as ``X-Session-ID``. The renderer is the ``renderers`` default one built from the tiny
model's local tokenizer; it never bridges turns (``bridge_to_next_turn`` returns None), so a
bridged turn's extra sampling key is sent through ``renderers.client.generate`` directly.
"""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
from openai import AsyncOpenAI
from renderers import create_renderer
from renderers.client import generate as renderers_generate
from verifiers.v1 import graph
from verifiers.v1.clients.train import TrainClient
from verifiers.v1.configs.client import TrainClientConfig
from verifiers.v1.dialects.chat import ChatDialect
from verifiers.v1.errors import ProviderError
from verifiers.v1.trace import AgentInfo, Trace, TraceTask
from verifiers.v1.types import SamplingConfig

ROUTE = "/inference/v1/generate"
DIALECT = ChatDialect()


def train_client(base_url: str, model_dir, monkeypatch, key: str = "unused") -> TrainClient:
    monkeypatch.setenv("VF_TRAIN_KEY", key)
    return TrainClient(TrainClientConfig(base_url=base_url, api_key_var="VF_TRAIN_KEY",
                                         renderer_model_name=str(model_dir)))


async def rollout(client: TrainClient, user_turns: list[str], max_tokens: int = 6) -> tuple[Trace, list]:
    """One verifiers rollout of ``len(user_turns)`` model turns; returns its trace and responses."""
    trace = Trace(task=TraceTask(type="Task", data={}), agent=AgentInfo(config={}))
    messages: list[dict] = []
    responses = []
    for text in user_turns:
        messages.append({"role": "user", "content": text})
        body = {"model": "policy", "messages": list(messages)}
        request = DIALECT.parse_request(body)
        turn = graph.prepare_turn(trace, request.messages, request.tools)
        sampling = SamplingConfig(max_tokens=max_tokens, temperature=1.0)
        response = await client.get_response(DIALECT, body, sampling, session_id=trace.id, turn=turn)
        turn.commit(response)
        responses.append(response)
        messages.append({"role": "assistant", "content": response.message.content or ""})
    return trace, responses


def run(coro_fn, client: TrainClient):
    async def main():
        try:
            return await coro_fn()
        finally:
            await client.close()
    return asyncio.run(main())


def sample_view(sample) -> tuple[list[int], list[int], list[float]]:
    """A training sample as (its tokens, their loss mask, the trained tokens' logprobs)."""
    tokens = sample.prompt_ids + sample.response_ids
    mask = [0] * len(sample.prompt_ids) + sample.loss_mask
    return tokens, mask, [lp for lp, m in zip(sample.response_logprobs, sample.loss_mask) if m]


def test_a_train_client_rollout_trains_on_exactly_the_tokens_it_sent_and_received(router, tiny_model_dir,
                                                                                   monkeypatch):
    """Two turns of one rollout on a per-trajectory base URL. The second prompt is the chat as
    the client re-renders it: it extends the first turn's segment when the re-rendering
    reproduces the sampled tokens, else the router forks a segment at the longest shared prefix
    (on the tiny model a reply cut at ``max_tokens`` re-tokenizes differently: a fork). Either
    way each trained token is one the client got back, with its logprob; the extension alone is
    ``test_token_generate.py``'s first test."""
    router.open_trajectory("vf-train")
    client = train_client(router.base_urls("vf-train")["openai"], tiny_model_dir, monkeypatch)
    _, responses = run(lambda: rollout(client, ["Count to three.", "Again."]), client)

    (p1, c1, l1), (p2, c2, l2) = [(r.tokens.prompt_ids, r.tokens.completion_ids, r.tokens.completion_logprobs)
                                  for r in responses]
    for completion, logprobs in ((c1, l1), (c2, l2)):
        assert 1 <= len(completion) <= 6 and len(logprobs) == len(completion)
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in logprobs)
    assert all(r.finish_reason in ("stop", "length") for r in responses)

    if p2[:len(p1) + len(c1)] == p1 + c1:
        between = len(p2) - len(p1) - len(c1)  # the client's tokens closing turn 1, opening turn 2
        expected = [(p2 + c2, [0] * len(p1) + [1] * len(c1) + [0] * between + [1] * len(c2), l1 + l2)]
    else:
        expected = [(p1 + c1, [0] * len(p1) + [1] * len(c1), l1),
                    (p2 + c2, [0] * len(p2) + [1] * len(c2), l2)]
    samples = router.finish_trajectory("vf-train")
    assert [sample_view(s) for s in samples] == expected


def test_the_session_header_makes_one_trajectory_per_rollout(make_router, engine_url, tiny_model_dir,
                                                             monkeypatch):
    """One base URL and key for every rollout (prime-rl's setup): with ``session_header``, the
    ``X-Session-ID`` TrainClient sends (the trace id) puts each rollout in a trajectory of its
    own, both turns of a rollout in the same one."""
    from loongsage.engines.client import EngineClient

    router = make_router([EngineClient(engine_url)], session_header="x-session-id",
                         auto_create_trajectories=True)
    client = train_client(f"{router.url}/v1", tiny_model_dir, monkeypatch, key="prime")

    async def two_rollouts():
        return [await rollout(client, ["Hello.", "More."]), await rollout(client, ["Bye."])]

    (trace_a, turns_a), (trace_b, turns_b) = run(two_rollouts, client)
    listing = httpx.get(f"{router.url}/v1/trajectories").json()["trajectories"]
    assert sorted(t["trajectory_id"] for t in listing) == sorted(f"prime.{t.id}" for t in (trace_a, trace_b))
    for trace, turns in ((trace_a, turns_a), (trace_b, turns_b)):
        samples = router.finish_trajectory(f"prime.{trace.id}")
        trained = [lp for s in samples for lp in sample_view(s)[2]]
        assert trained == [lp for r in turns for lp in r.tokens.completion_logprobs]
        assert samples[-1].prompt_ids + samples[-1].response_ids == \
            turns[-1].tokens.prompt_ids + turns[-1].tokens.completion_ids


def test_a_prompt_longer_than_the_models_context_is_refused_by_the_client(router, tiny_model_dir,
                                                                          monkeypatch):
    """The router's ``/v1/models`` carries ``max_model_len`` (the tokenizer's 2048), which the
    client reads to refuse an overlong prompt before sending it."""
    router.open_trajectory("long")
    client = train_client(router.base_urls("long")["openai"], tiny_model_dir, monkeypatch)
    with pytest.raises(ProviderError, match=r"exceeds maximum context length \(2048\)"):
        run(lambda: rollout(client, ["word " * 3000]), client)
    assert router.finish_trajectory("long") == []


def test_a_bridged_turns_sampling_key_is_accepted(router, tokenizer):
    """On a bridged turn TrainClient adds ``routed_experts_prompt_start`` (where the MoE routing
    it wants back starts); the router sends no routing back, so the key changes nothing."""
    router.open_trajectory("bridged")
    client = AsyncOpenAI(base_url=router.base_urls("bridged")["openai"], api_key="unused")
    messages = [{"role": "user", "content": "Go on."}]

    async def call() -> dict:
        try:
            return await renderers_generate(
                client=client, renderer=create_renderer(tokenizer), messages=messages, model="policy",
                sampling_params={"max_tokens": 4, "routed_experts_prompt_start": 3})
        finally:
            await client.close()

    result = asyncio.run(call())
    [sample] = router.finish_trajectory("bridged")
    assert sample_view(sample) == (result["prompt_ids"] + result["completion_ids"],
                                   [0] * len(result["prompt_ids"]) + [1] * len(result["completion_ids"]),
                                   result["completion_logprobs"])


@pytest.mark.parametrize("body, field", [
    ({"model": "policy", "sampling_params": {"max_tokens": 4}}, "token_ids"),
    ({"token_ids": [1, 2]}, "model"),
    ({"model": "policy", "token_ids": [1, 2], "sampling_params": {"routed_experts_prompt_start": "x"}},
     "sampling_params.routed_experts_prompt_start"),
    ({"model": "policy", "token_ids": [1, 2], "sampling_params": {"routed_experts_prompt_start": -1}},
     "sampling_params.routed_experts_prompt_start"),
    ({"model": "policy", "token_ids": [1, 2], "sampling_params": {"guided_json": {}}},
     "sampling_params.guided_json"),
])
def test_a_bad_body_on_the_root_route_is_refused_naming_the_field(router, body, field):
    router.open_trajectory("bad")
    reply = httpx.post(f"{router.url}{ROUTE}", json=body, headers={"Authorization": "Bearer bad:0"},
                       timeout=30)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == field and field in reply.json()["error"]["message"]
    assert router.finish_trajectory("bad") == []
