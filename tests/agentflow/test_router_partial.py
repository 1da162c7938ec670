"""Partial rollout through the router: a turn in flight when the weights change is aborted at
the real embedded engine (``EnginePool.abort_for_update``), held while the new weights are
written, and continued from its tokens under them. The agent's client (the real ``openai`` and
``anthropic`` SDKs, streaming and not) gets one reply whose tokens are the concatenation; the
stored TITO trajectory is token-exact and each token keeps the version and the logprob of the
weights that sampled it."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from transformers import AutoModelForCausalLM

from loongsage.engines.client import EngineClient
from loongsage.engines.pool import EnginePool

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

SYSTEM = "You are terse."
USER = "Hello there"
MAX_TOKENS = 400  # far more than are sampled before the test's update lands


def weights(path, version: int):
    """The tiny model as version ``version``: the checkpoint itself at 0, noised after."""
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    if version:
        gen = torch.Generator().manual_seed(100 + version)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


@pytest.fixture(scope="module")
def engine(running_engine, tiny_model_dir):
    with running_engine(tiny_model_dir) as eng:
        yield eng


@pytest.fixture
def pooled(engine, make_router, tiny_model_dir):
    """``(pool, router over it, the engine's weight version)``, the engine back on the
    checkpoint's weights as version 0 (greedy on the test prompt, they never stop before
    ``MAX_TOKENS``, so no turn ends before the test's update reaches it)."""
    engine.apply_weights(weights(tiny_model_dir, 0).named_parameters(), 0)
    pool = EnginePool([EngineClient(engine.url)])
    return pool, make_router(pool), engine.weight_version


def ask(protocol: str, stream: bool, urls: dict[str, str]) -> tuple[str, str]:
    """One request as an agent program makes it; returns (reply text, streamed text)."""
    if protocol == "openai":
        client = openai.OpenAI(base_url=urls["openai"], api_key="unused", max_retries=0, timeout=120)
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
        if not stream:
            out = client.chat.completions.create(model="policy", messages=msgs, max_tokens=MAX_TOKENS,
                                                 temperature=0)
            return out.choices[0].message.content, ""
        chunks = list(client.chat.completions.create(model="policy", messages=msgs, max_tokens=MAX_TOKENS,
                                                     temperature=0, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, text
    client = anthropic.Anthropic(base_url=urls["anthropic"], api_key="unused", max_retries=0, timeout=120)
    kwargs = dict(model="policy", system=SYSTEM, max_tokens=MAX_TOKENS, extra_body={"temperature": 0},
                  messages=[{"role": "user", "content": USER}])
    if not stream:
        return client.messages.create(**kwargs).content[0].text, ""
    with client.messages.stream(**kwargs) as s:
        streamed = "".join(s.text_stream)
        return s.get_final_message().content[0].text, streamed


def forward_logprobs(model, ids: list[int], positions: list[int]) -> torch.Tensor:
    with torch.no_grad():
        lp = model(torch.tensor([ids])).logits.float().log_softmax(-1)[0]
    return torch.stack([lp[i - 1, ids[i]] for i in positions])


def mid_turn(engine, executor, protocol: str, stream: bool, urls: dict[str, str]):
    """Send the request from another thread; return its future once 3 tokens are sampled."""
    reply = executor.submit(ask, protocol, stream, urls)
    deadline = time.monotonic() + 60
    while not engine.scheduler._rows or len(engine.scheduler._rows[0].output_ids) < 3:
        assert not reply.done(), f"the turn ended before the update: {reply.result()}"
        assert time.monotonic() < deadline
        time.sleep(0.002)
    return reply


def split_by_version(traj, path, old_version: int, new_version: int) -> tuple[list[int], int]:
    """The turn's sampled positions and where the new version starts; checks that every token
    before it has the old version, every one after the new, and that each logprob is that
    version's model's."""
    sampled = [i for i, m in enumerate(traj.loss_mask) if m]
    versions = [traj.versions[i] for i in sampled]
    split = versions.index(new_version)
    assert 3 <= split < len(sampled) <= MAX_TOKENS
    assert versions == [old_version] * split + [new_version] * (len(sampled) - split)
    got = torch.tensor([traj.logprobs[i] for i in sampled])
    old = forward_logprobs(weights(path, old_version), traj.tokens, sampled)
    new = forward_logprobs(weights(path, new_version), traj.tokens, sampled)
    torch.testing.assert_close(got[:split], old[:split], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[split:], new[split:], atol=1e-5, rtol=0)
    return sampled, split


@pytest.mark.parametrize("protocol,stream", [("openai", False), ("openai", True),
                                             ("anthropic", False), ("anthropic", True)])
def test_a_turn_aborted_for_a_weight_update_continues_under_the_new_weights(
        protocol, stream, engine, pooled, tokenizer, tiny_model_dir):
    pool, router, old_version = pooled
    new_version = old_version + 1
    tid = f"partial-{protocol}-{stream}"
    router.open_trajectory(tid)
    with ThreadPoolExecutor(1) as executor:
        reply = mid_turn(engine, executor, protocol, stream, router.base_urls(tid))
        asyncio.run(pool.abort_for_update())
        time.sleep(0.3)  # the continuation waits in the pool, not at the engine
        assert engine.scheduler.load()["running"] == engine.scheduler.load()["waiting"] == 0
        assert not reply.done()
        engine.apply_weights(weights(tiny_model_dir, new_version).named_parameters(), new_version)
        pool.resume_after_update()
        text, streamed = reply.result(timeout=120)

    traj = router.store.lookup(tid)
    sampled, split = split_by_version(traj, tiny_model_dir, old_version, new_version)
    assert traj.metadata["continued_turns"] == 1 and traj.status == "active"
    assert sampled == list(range(sampled[0], sampled[0] + len(sampled)))  # one turn, no gap
    # the reply is the concatenation of both engine requests' tokens
    assert text == tokenizer.decode([traj.tokens[i] for i in sampled], skip_special_tokens=True)
    if stream:
        assert streamed == text
    sample, = router.finish_trajectory(tid)
    assert sample.weight_versions[:split] == [old_version] * split
    assert set(sample.weight_versions[split:]) == {new_version}


def test_a_turn_aborted_for_any_other_reason_still_fails(engine, pooled):
    """Only an abort for a weight update is continued: an engine-side abort fails the turn."""
    pool, router, _ = pooled
    router.open_trajectory("killed")
    with ThreadPoolExecutor(1) as executor:
        reply = mid_turn(engine, executor, "openai", False, router.base_urls("killed"))
        engine.scheduler.abort(None).result()
        with pytest.raises(openai.InternalServerError, match="the engine aborted request"):
            reply.result(timeout=60)
    traj = router.store.lookup("killed")
    assert traj.status == "failed" and sum(traj.loss_mask) == 0 and pool.update_aborts == 0


@pytest.mark.parametrize("stream", [False, True])
def test_without_partial_rollout_a_running_turn_finishes_under_the_new_weights_token_by_token(
        stream, engine, pooled, tokenizer, tiny_model_dir):
    """The scheduler's one semantics (``runtime.async_scheduler``) without partial rollout:
    nothing is aborted or paused; the engine applies the new weights between two decode steps
    and the running turn goes on under them, each token tagged with the version that sampled
    it, streamed or not."""
    pool, router, old_version = pooled
    new_version = old_version + 1
    tid = f"swap-{stream}"
    router.open_trajectory(tid)
    new_weights = weights(tiny_model_dir, new_version).named_parameters()
    with ThreadPoolExecutor(1) as executor:
        reply = mid_turn(engine, executor, "openai", stream, router.base_urls(tid))
        engine.apply_weights(new_weights, new_version)
        text, streamed = reply.result(timeout=120)

    traj = router.store.lookup(tid)
    sampled, _ = split_by_version(traj, tiny_model_dir, old_version, new_version)
    assert "continued_turns" not in traj.metadata and pool.update_aborts == 0
    assert text == tokenizer.decode([traj.tokens[i] for i in sampled], skip_special_tokens=True)
