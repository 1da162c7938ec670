"""A router turn whose engine replica is SIGKILLed mid-generation is continued on another
replica: the agent (the real ``openai`` and ``anthropic`` SDKs, streaming and not) gets one
reply, only later.

Real processes: two embedded engine servers, each a process of its own (tiny model), behind
an ``EnginePool`` and the real router on loopback. The first replica serves the turn and is
SIGKILLed once the turn is under way (streamed: once the agent has received text). The other
replica reports weight version 1 (same weights), so the stored trajectory shows which
replica sampled each token. Checked: the reply is the trajectory's sampled tokens decoded,
the turn used exactly its token budget (what was kept plus the remaining budget), every
token's logprob is the model's own on the final token sequence (the partial-rollout tests'
tolerance), the tokens a streamed turn had received are kept with version 0, and the attempt
is in the trajectory's metadata, its samples' ``reward_info`` and the pool's retry record.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import pytest
import torch
from transformers import AutoModelForCausalLM

from loongsage.engines.client import EngineClient
from loongsage.engines.pool import EnginePool

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

SYSTEM = "You are terse."
USER = "Hello there"
MAX_TOKENS = 96  # greedy on this prompt the tiny model never stops before it
RECEIVED_BEFORE_KILL = 8  # streamed: text pieces the agent has when the engine dies


def ask(protocol: str, stream: bool, urls: dict[str, str], received: Callable[[], None]) -> tuple[str, str]:
    """One request as an agent makes it; returns (reply text, streamed text). ``received`` is
    called once, in the agent's thread, when a streamed reply has delivered
    ``RECEIVED_BEFORE_KILL`` text pieces (the kill cannot then lag behind a fast engine)."""
    pieces: list[str] = []

    def got(text: str) -> None:
        pieces.append(text)
        if len(pieces) == RECEIVED_BEFORE_KILL:
            received()

    if protocol == "openai":
        client = openai.OpenAI(base_url=urls["openai"], api_key="unused", max_retries=0, timeout=120)
        kwargs = dict(model="policy", max_tokens=MAX_TOKENS, temperature=0,
                      messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}])
        if not stream:
            return client.chat.completions.create(**kwargs).choices[0].message.content, ""
        for chunk in client.chat.completions.create(**kwargs, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                got(chunk.choices[0].delta.content)
        return "".join(pieces), "".join(pieces)
    client = anthropic.Anthropic(base_url=urls["anthropic"], api_key="unused", max_retries=0, timeout=120)
    kwargs = dict(model="policy", system=SYSTEM, max_tokens=MAX_TOKENS, extra_body={"temperature": 0},
                  messages=[{"role": "user", "content": USER}])
    if not stream:
        return client.messages.create(**kwargs).content[0].text, ""
    with client.messages.stream(**kwargs) as s:
        for text in s.text_stream:
            got(text)
        return s.get_final_message().content[0].text, "".join(pieces)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


def forward_logprobs(model, ids: list[int], positions: list[int]) -> torch.Tensor:
    with torch.no_grad():
        lp = model(torch.tensor([ids])).logits.float().log_softmax(-1)[0]
    return torch.stack([lp[i - 1, ids[i]] for i in positions])


@pytest.fixture(scope="module")
def survivor(engine_servers):
    """The replica that lives, reporting weight version 1; shared by the module's tests."""
    return engine_servers(weight_version=1)


@pytest.mark.parametrize("protocol,stream", [("openai", False), ("openai", True),
                                             ("anthropic", False), ("anthropic", True)])
def test_a_turn_whose_replica_is_killed_completes_on_the_other_one(
        protocol, stream, engine_servers, survivor, make_router, tokenizer, model):
    victim = engine_servers(weight_version=0)
    pool = EnginePool([victim.client, survivor.client], wait_s=60)
    router = make_router(pool)
    tid = f"failover-{protocol}-{stream}"
    router.open_trajectory(tid)
    with ThreadPoolExecutor(1) as executor:
        reply = executor.submit(ask, protocol, stream, router.base_urls(tid), victim.kill)
        deadline = time.monotonic() + 60
        while not stream and not victim.load()["running"]:
            assert not reply.done(), f"the turn ended before the kill: {reply.result()}"
            assert time.monotonic() < deadline
            time.sleep(0.005)
        if not stream:
            victim.kill()
        text, streamed = reply.result(timeout=120)

    traj = router.store.lookup(tid)
    assert traj.status == "active" and traj.error is None
    sampled = [i for i, m in enumerate(traj.loss_mask) if m]
    assert sampled == list(range(sampled[0], sampled[0] + len(sampled)))  # one turn, no gap
    assert len(sampled) == MAX_TOKENS  # the kept tokens plus the remaining budget, no more
    assert text == tokenizer.decode([traj.tokens[i] for i in sampled], skip_special_tokens=True)
    if stream:
        assert streamed == text
    failover, = traj.metadata["turn_failovers"]
    kept = failover["tokens_kept"]
    assert traj.metadata["turn_retries"] == 1
    assert (failover["attempt"], failover["replica"]) == (1, 0) and "unreachable" in failover["reason"]
    # streamed: what the agent had received stays, sampled by the dead replica (version 0);
    # not streamed: nothing came back before the engine died, all is the survivor's (version 1)
    assert kept >= RECEIVED_BEFORE_KILL if stream else kept == 0
    versions = [traj.versions[i] for i in sampled]
    assert versions == [0] * kept + [1] * (MAX_TOKENS - kept)
    got = torch.tensor([traj.logprobs[i] for i in sampled])
    torch.testing.assert_close(got, forward_logprobs(model, traj.tokens, sampled), atol=1e-5, rtol=0)
    retry, = pool.take_retries()
    assert (retry.rid, retry.attempt, retry.replica) == (failover["rid"], 1, 0)
    assert 0 in pool.down and pool.inflight == [0, 0]
    assert survivor.load()["running"] == 0
    sample, = router.finish_trajectory(tid)
    assert sample.reward_info["turn_retries"] == 1



@pytest.mark.parametrize("stream", [False, True])
def test_a_turn_waiting_on_a_replica_declared_down_moves_to_a_live_one(
        stream, hung_url, survivor, make_router, tokenizer):
    """The engine monitor declares the hung replica down (from its own thread): the turn
    waiting on it is sent to the live replica at once, not after the client's timeout."""
    pool = EnginePool([EngineClient(hung_url, timeout=300), survivor.client])
    router = make_router(pool)
    router.open_trajectory("hung")
    with ThreadPoolExecutor(1) as executor:
        reply = executor.submit(ask, "openai", stream, router.base_urls("hung"), lambda: None)
        time.sleep(1.0)
        assert not reply.done() and pool.inflight == [1, 0]  # waiting on the hung engine
        threading.Thread(target=pool.mark_down, args=(0, "its process is stopped (hung)")).start()
        text, _ = reply.result(timeout=60)
    traj = router.store.lookup("hung")
    sampled = [i for i, m in enumerate(traj.loss_mask) if m]
    assert traj.status == "active" and len(sampled) == MAX_TOKENS
    assert text == tokenizer.decode([traj.tokens[i] for i in sampled], skip_special_tokens=True)
    assert [(f["replica"], f["reason"], f["tokens_kept"]) for f in traj.metadata["turn_failovers"]] == [
        (0, "its process is stopped (hung)", 0)]
    assert {traj.versions[i] for i in sampled} == {1}
    assert [(r.attempt, r.replica) for r in pool.take_retries()] == [(1, 0)]


@pytest.mark.parametrize("stream", [False, True])
def test_a_turn_that_fails_on_every_replica_is_an_error_in_the_wire_format(stream, make_router):
    """Two replicas nobody listens on (dead engines), two attempts: the agent gets the router's
    error in its SDK's type (HTTP 500; an error event when streamed), the trajectory is marked
    failed naming both attempts, and the first attempt is in the pool's retry record."""
    ports = []
    for _ in range(2):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    pool = EnginePool([EngineClient(f"http://127.0.0.1:{p}") for p in ports], max_attempts=2, wait_s=5)
    router = make_router(pool)
    router.open_trajectory("dead")
    client = anthropic.Anthropic(base_url=router.base_urls("dead")["anthropic"], api_key="x", max_retries=0)
    kwargs = dict(model="policy", max_tokens=8, messages=[{"role": "user", "content": USER}])
    with pytest.raises(anthropic.APIStatusError, match="failed on 2 engine replicas") as err:
        if stream:
            with client.messages.stream(**kwargs) as s:
                "".join(s.text_stream)
        else:
            client.messages.create(**kwargs)
    assert stream or err.value.status_code == 500
    traj = router.store.lookup("dead")
    assert traj.status == "failed" and "failed on 2 engine replicas" in traj.error
    assert sum(traj.loss_mask) == 0 and traj.metadata["turn_retries"] == 1
    assert sorted(pool.down) == [0, 1]
    assert [(r.attempt, r.replica) for r in pool.take_retries()] == [(1, 0)]


def test_a_refusal_by_a_live_engine_is_not_retried(engine_servers, survivor, make_router):
    """An engine that answers HTTP 4xx refused the request (the embedded engine takes no stop
    strings): the turn fails at once, no replica is marked down and nothing is sent again."""
    pool = EnginePool([engine_servers().client, survivor.client])
    router = make_router(pool)
    router.open_trajectory("refused")
    client = openai.OpenAI(base_url=router.base_urls("refused")["openai"], api_key="x", max_retries=0)
    with pytest.raises(openai.InternalServerError, match="HTTP 400") as err:
        client.chat.completions.create(model="policy", max_tokens=8, stop=["\n"],
                                       messages=[{"role": "user", "content": USER}])
    assert "sampling_params.stop" in str(err.value)
    assert pool.take_retries() == [] and not pool.down and pool.served == [1, 0]
    assert router.store.lookup("refused").status == "failed"
