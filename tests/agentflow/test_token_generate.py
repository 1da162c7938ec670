"""vLLM's token-in route ``POST /inference/v1/generate`` on the router: prime-rl's and verifiers'
training client (``renderers.client.generate``, the real package) gets the sampled tokens with one
logprob each, and the router records every turn token for token, extending the segment the
prompt continues, forking at the longest shared token prefix otherwise. Real router and
embedded engine (tiny model) on loopback."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from openai import AsyncOpenAI
from renderers import create_renderer
from renderers.client import generate as renderers_generate

ROUTE = "/inference/v1/generate"


def chat_ids(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def post(router, tid: str, token_ids: list[int], **sampling) -> httpx.Response:
    body = {"model": "policy", "token_ids": token_ids,
            "sampling_params": {"max_tokens": 8, "temperature": 1.0, "seed": 3, "logprobs": 1, **sampling}}
    return httpx.post(f"{router.url}/{tid}/0{ROUTE}", json=body, timeout=120)


def attempt(router, tid: str) -> dict:
    return httpx.get(f"{router.url}/v1/trajectories/{tid}").json()["attempts"][0]


def test_a_token_turn_is_recorded_as_sent_and_a_continuation_extends_its_segment(router, tokenizer):
    router.open_trajectory("tok")
    prompt = chat_ids(tokenizer, [{"role": "user", "content": "Count to three."}])
    reply = post(router, "tok", prompt)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    out = choice["token_ids"]
    assert 1 <= len(out) <= 8 and choice["finish_reason"] in ("stop", "length")
    assert [e["token"] for e in choice["logprobs"]["content"]] == [f"token_id:{t}" for t in out]
    assert reply.json()["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(out),
                                     "total_tokens": len(prompt) + len(out)}

    user = list(tokenizer.encode("<|im_end|>\n<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n",
                                 add_special_tokens=False))
    second = post(router, "tok", prompt + out + user, seed=4)
    assert second.status_code == 200, second.text
    out2 = second.json()["choices"][0]["token_ids"]

    traj = attempt(router, "tok")
    assert traj["tokens"] == prompt + out + user + out2
    assert traj["loss_mask"] == [0] * len(prompt) + [1] * len(out) + [0] * len(user) + [1] * len(out2)
    lps = [e["logprob"] for e in choice["logprobs"]["content"]] + \
        [e["logprob"] for e in second.json()["choices"][0]["logprobs"]["content"]]
    assert [lp for lp, m in zip(traj["logprobs"], traj["loss_mask"]) if m] == lps
    assert len(traj["segments"]) == 1 and traj["segments"][0]["num_turns"] == 2


def test_a_diverging_prompt_forks_at_the_longest_shared_token_prefix(router, tokenizer):
    router.open_trajectory("fork")
    prompt = chat_ids(tokenizer, [{"role": "user", "content": "Name a colour."}])
    out = post(router, "fork", prompt).json()["choices"][0]["token_ids"]
    other = prompt[:-3] + list(tokenizer.encode("Name a fruit.", add_special_tokens=False))
    assert post(router, "fork", other).status_code == 200
    segments = attempt(router, "fork")["segments"]
    assert [s["origin"] for s in segments] == ["root", "compact"]
    assert segments[1]["parent"] == 0 and segments[1]["shared_len"] == len(prompt) - 3
    assert segments[1]["spans"][0] == [0, len(prompt) - 3]  # the root's tokens, not a copy
    assert len(out) >= 1


@pytest.mark.parametrize("body, field", [
    ({"token_ids": [1, 2], "stream": True}, "stream"),
    ({"token_ids": [1, 2], "sampling_params": {"best_of": 2}}, "sampling_params.best_of"),
    ({"token_ids": [1, 2], "sampling_params": {"repetition_penalty": 1.2}}, "sampling_params.repetition_penalty"),
    ({"token_ids": [1, 2], "sampling_params": {"logprobs": 5}}, "sampling_params.logprobs"),
    ({"token_ids": "hello"}, "token_ids"),
    ({"token_ids": []}, "token_ids"),
    ({"token_ids": [1, 2], "features": {}}, "features"),
    ({"token_ids": [1, 2], "sampling_params": {"top_k": -5}}, "sampling_params.top_k"),
    ({"token_ids": [1, 2], "sampling_params": {"temperature": "hot"}}, "sampling_params.temperature"),
    ({"token_ids": [1, 2], "sampling_params": {"stop_token_ids": [-1]}}, "sampling_params.stop_token_ids"),
])
def test_refused_requests_name_the_field(router, body, field):
    router.open_trajectory("bad")
    reply = httpx.post(f"{router.url}/bad/0{ROUTE}", json={"model": "policy", **body}, timeout=30)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == field
    assert attempt(router, "bad")["tokens"] == []


def test_the_renderers_training_client_reads_the_reply_the_router_recorded(router, tokenizer):
    """verifiers' ``--client.type train`` path: ``renderers.client.generate`` renders the chat,
    posts its ids and parses our reply (it checks one ``token_id:N`` logprob per token)."""
    router.open_trajectory("client")
    renderer = create_renderer(tokenizer)
    client = AsyncOpenAI(base_url=router.base_urls("client")["openai"], api_key="unused")
    messages = [{"role": "user", "content": "Say something."}]

    async def call() -> dict:
        try:
            return await renderers_generate(client=client, renderer=renderer, messages=messages,
                                            model="policy", sampling_params={"max_tokens": 6, "seed": 1})
        finally:
            await client.close()

    result = asyncio.run(call())
    traj = attempt(router, "client")
    assert result["prompt_ids"] == chat_ids(tokenizer, messages)
    assert traj["tokens"] == result["prompt_ids"] + result["completion_ids"]
    assert [lp for lp, m in zip(traj["logprobs"], traj["loss_mask"]) if m] == result["completion_logprobs"]
    assert 1 <= len(result["completion_ids"]) <= 6


def test_a_prompt_extends_the_longest_segment_it_continues():
    """A fork left holding only borrowed tokens (its turn failed and was rolled back) also
    matches a prompt that continues its parent: the prompt goes on the parent, whose sampled
    reply it carries, not on the fork as prompt tokens."""
    from loongsage.agentflow.store import Trajectory
    from loongsage.agentflow.tito import plan_tokens

    traj = Trajectory("t", "0")
    root = plan_tokens(traj, [1, 2, 3]).segment
    traj.append(root, [4, 5], sampled=True, logprobs=[-0.1, -0.2], versions=[0, 0])
    fork = plan_tokens(traj, [1, 2, 9]).segment  # diverges after two shared tokens
    traj.rollback(fork, 2, 0)  # its turn failed: the fork keeps only the borrowed [1, 2]
    assert fork.segment_id == 1 and traj.segment_tokens(fork) == [1, 2]

    plan = plan_tokens(traj, [1, 2, 3, 4, 5, 6])
    assert plan.segment is root and plan.new_ids == [6] and not plan.forked
