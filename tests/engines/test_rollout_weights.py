"""Weight swaps on the embedded rollout engine (real HTTP server on the tiny model): after
``apply_weights`` or ``/update_weights_from_tensor`` the engine's logprobs are exactly those of
the new weights, a swap during a paused generation re-tags the tokens that follow, and a bad
update changes nothing."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from loongsage.engines.client import EngineClient
from loongsage.engines.replies import EngineError

PROMPT = [5, 17, 42, 99, 7, 300]


def load(path, noise_seed: int | None):
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    if noise_seed is not None:
        gen = torch.Generator().manual_seed(noise_seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


def forward_logprobs(model, prompt, output) -> torch.Tensor:
    with torch.no_grad():
        lp = model(torch.tensor([prompt + output])).logits.float().log_softmax(-1)[0]
    return torch.stack([lp[len(prompt) - 1 + i, t] for i, t in enumerate(output)])


@pytest.fixture
def client(engine):
    with EngineClient(engine.url, timeout=120) as c:
        yield c


def sampled(client, n=16):
    return client.generate(PROMPT, {"max_new_tokens": n, "ignore_eos": True})


def test_apply_weights_makes_next_logprobs_those_of_the_new_weights(engine, client, tiny_model_dir):
    old, new = load(tiny_model_dir, None), load(tiny_model_dir, noise_seed=11)
    assert engine.apply_weights(new.named_parameters(), version=7) == 7
    out = sampled(client)
    assert out.weight_version == 7 and client.get_weight_version() == 7
    got = torch.tensor(out.output_logprobs)
    assert torch.allclose(got, forward_logprobs(new, PROMPT, out.output_ids), atol=1e-5, rtol=0)
    assert (got - forward_logprobs(old, PROMPT, out.output_ids)).abs().max() > 1e-2


def test_update_weights_from_tensor_over_http(engine, client, tiny_model_dir):
    new = load(tiny_model_dir, noise_seed=12)
    reply = client.update_weights_from_tensor(new.named_parameters(), weight_version=4)
    assert reply["success"] and client.get_weight_version() == 4
    out = sampled(client)
    assert torch.allclose(torch.tensor(out.output_logprobs),
                          forward_logprobs(new, PROMPT, out.output_ids), atol=1e-5, rtol=0)
    client.update_weights_from_tensor(list(new.named_parameters())[:1])
    assert client.get_weight_version() == 5  # no version given: bumped by one
    assert client.get_model_info()["weight_version"] == "5"


def test_swap_during_paused_generation_retags_following_tokens(engine, client, tiny_model_dir):
    old, new = load(tiny_model_dir, None), load(tiny_model_dir, noise_seed=13)

    async def run():
        task = asyncio.create_task(client.agenerate(
            PROMPT, {"max_new_tokens": 40, "ignore_eos": True}, rid="partial"))
        deadline = time.monotonic() + 30
        while not engine.scheduler._rows or len(engine.scheduler._rows[0].output_ids) < 3:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
        await client.apause_generation("in_place")
        await asyncio.to_thread(engine.apply_weights, new.named_parameters(), 1)
        await client.acontinue_generation()
        return await task

    out = asyncio.run(run())
    versions = out.output_weight_versions
    split = versions.index(1)
    assert 3 <= split < 40 and versions == [0] * split + [1] * (40 - split)
    assert out.finish_reason == "length" and out.weight_version == 1
    got = torch.tensor(out.output_logprobs)
    ref_old = forward_logprobs(old, PROMPT, out.output_ids)
    ref_new = forward_logprobs(new, PROMPT, out.output_ids)
    assert torch.allclose(got[:split], ref_old[:split], atol=1e-5, rtol=0)
    assert torch.allclose(got[split:], ref_new[split:], atol=1e-5, rtol=0)


def test_bad_update_is_rejected_and_changes_nothing(engine, client, tiny_model_dir):
    new = load(tiny_model_dir, noise_seed=14)
    before = sampled(client)
    good = list(new.named_parameters())[:2]
    with pytest.raises(KeyError, match="no.such.weight"):
        engine.apply_weights(good + [("no.such.weight", torch.zeros(3))], version=9)
    name, tensor = good[0]
    with pytest.raises(EngineError, match=name) as err:
        client.update_weights_from_tensor([good[1], (name, tensor[:2])])
    assert err.value.status == 400
    assert client.get_weight_version() == 0
    after = client.generate(PROMPT, {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True})
    ref = forward_logprobs(load(tiny_model_dir, None), PROMPT, after.output_ids)
    assert torch.allclose(torch.tensor(after.output_logprobs), ref, atol=1e-5, rtol=0)
    assert before.weight_version == 0


def test_malformed_weight_payload_is_400(engine):
    resp = httpx.post(engine.url + "/update_weights_from_tensor",
                      json={"serialized_named_tensors": ["not base64!"]})
    assert resp.status_code == 400
    assert resp.json()["error"]["field"] == "serialized_named_tensors"
    resp = httpx.post(engine.url + "/update_weights_from_tensor",
                      json={"serialized_named_tensors": ["x"], "load_format": "flattened_bucket"})
    assert resp.status_code == 400 and resp.json()["error"]["field"] == "load_format"
