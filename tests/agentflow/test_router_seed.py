"""The router honours a client's ``seed`` on all three wire protocols (OpenAI chat, Responses,
Anthropic messages) by sending it as the engine's ``sampling_seed``, and a trajectory opened with
the rollout's seed (``metadata["sampling_seed"]``) samples from it when the client sends none:
the same seed gives the same tokens in another trajectory, another seed other tokens. Before,
the routers parsed ``seed`` (chat only) and dropped it, and the engine's one generator made
two identical requests sample differently. Real router and engine (tiny model) on loopback."""

from __future__ import annotations

import httpx
import pytest

MESSAGES = [{"role": "user", "content": "Tell me a story about seeds."}]


def sampled(router, tid: str) -> list[int]:
    body = httpx.get(f"{router.url}/v1/trajectories/{tid}").json()
    traj = body["attempts"][0]
    return [t for t, m in zip(traj["tokens"], traj["loss_mask"]) if m]


def post(router, tid: str, wire: str, seed: int | None) -> None:
    urls = router.base_urls(tid)
    extra = {} if seed is None else {"seed": seed}
    if wire == "chat":
        url, body = urls["openai"] + "/chat/completions", {"messages": MESSAGES, "max_tokens": 16}
    elif wire == "responses":
        url, body = urls["openai"] + "/responses", {"input": MESSAGES[0]["content"], "max_output_tokens": 16}
    else:
        url, body = urls["anthropic"] + "/v1/messages", {"messages": MESSAGES, "max_tokens": 16}
    resp = httpx.post(url, json={"model": "policy", "temperature": 1.0, **body, **extra}, timeout=120)
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("wire", ["chat", "responses", "anthropic"])
def test_the_clients_seed_decides_the_tokens_on_every_protocol(router, wire):
    runs = {}
    for tid, seed in ((f"{wire}-a", 5), (f"{wire}-b", 5), (f"{wire}-c", 6)):
        router.open_trajectory(tid)
        post(router, tid, wire, seed)
        runs[tid] = sampled(router, tid)
    assert len(runs[f"{wire}-a"]) >= 8
    assert runs[f"{wire}-a"] == runs[f"{wire}-b"]
    assert runs[f"{wire}-a"] != runs[f"{wire}-c"]


def test_a_trajectory_seed_decides_the_tokens_when_the_client_sends_none(router):
    runs = {}
    for tid, seed in (("traj-a", 91), ("traj-b", 91), ("traj-c", 92)):
        router.open_trajectory(tid, sampling_seed=seed)
        post(router, tid, "chat", None)
        runs[tid] = sampled(router, tid)
    assert runs["traj-a"] == runs["traj-b"]
    assert runs["traj-a"] != runs["traj-c"]
    # the client's own seed wins over the trajectory's
    router.open_trajectory("traj-d", sampling_seed=91)
    post(router, "traj-d", "chat", 5)
    router.open_trajectory("traj-e", sampling_seed=92)
    post(router, "traj-e", "chat", 5)
    assert sampled(router, "traj-d") == sampled(router, "traj-e")
