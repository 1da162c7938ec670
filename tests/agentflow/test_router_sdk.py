"""The router on loopback, driven by the real ``openai`` and ``anthropic`` SDKs, backed by the
real embedded engine serving the tiny model. Assertions are on the stored tokens."""

from __future__ import annotations

import time

import httpx
import pytest
import torch

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

SYSTEM = "You are terse."


def stored(router, tid, aid="0"):
    body = httpx.get(f"{router.url}/v1/trajectories/{tid}").json()
    return next(a for a in body["attempts"] if a["attempt_id"] == aid)


def render(tokenizer, messages, generation=False):
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)


def oai(router, tid):
    return openai.OpenAI(base_url=router.base_urls(tid)["openai"], api_key="unused", max_retries=0)


def test_chat_multi_turn_stores_the_conversation_without_retokenizing(router, tokenizer):
    router.open_trajectory("chat")
    client = oai(router, "chat")
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there"}]
    first = client.chat.completions.create(model="policy", messages=msgs, max_tokens=6, temperature=0)
    after_one = stored(router, "chat")["tokens"]
    msgs += [{"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "and then?"}]
    second = client.chat.completions.create(model="policy", messages=msgs, max_tokens=6, temperature=0)
    traj = stored(router, "chat")
    assert len(traj["segments"]) == 1 and traj["segments"][0]["origin"] == "root"
    assert traj["tokens"][: len(after_one)] == after_one  # turn 1 (sampled ids included) kept exactly
    assert sum(traj["loss_mask"]) == first.usage.completion_tokens + second.usage.completion_tokens
    close = "\n" if first.choices[0].finish_reason == "stop" else "<|im_end|>\n"
    new_text = close + render(tokenizer, msgs, True)[len(render(tokenizer, msgs[:3])):]
    assert second.usage.prompt_tokens == len(after_one) + len(tokenizer.encode(new_text, add_special_tokens=False))
    full = msgs + [{"role": "assistant", "content": second.choices[0].message.content}]
    if second.choices[0].finish_reason == "stop":
        assert tokenizer.decode(traj["tokens"]) + "\n" == render(tokenizer, full)
    else:  # cut by max_tokens: the turn has no end-of-turn token yet
        assert tokenizer.decode(traj["tokens"]) + "<|im_end|>\n" == render(tokenizer, full)
    masked = [i for i, m in enumerate(traj["loss_mask"]) if m]
    assert all(traj["versions"][i] == 0 for i in masked) and all(traj["logprobs"][i] < 0 for i in masked)


def test_stored_logprobs_equal_the_models_fp32_logprobs(router, tokenizer, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    router.open_trajectory("lp")
    oai(router, "lp").chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "count to three"}], max_tokens=12, temperature=1.0)
    traj = stored(router, "lp")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([traj["tokens"]])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.float(), dim=-1)[0]
    masked = [i for i, m in enumerate(traj["loss_mask"]) if m]
    assert len(masked) == 12 or traj["tokens"][masked[-1]] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    train = torch.stack([logp[i - 1, traj["tokens"][i]] for i in masked])
    torch.testing.assert_close(train, torch.tensor([traj["logprobs"][i] for i in masked]), atol=1e-5, rtol=0)


def test_streaming_yields_the_same_tokens_as_non_streaming(router):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there"}]
    for tid in ("plain", "streamed"):
        router.open_trajectory(tid)
    plain = oai(router, "plain").chat.completions.create(model="policy", messages=msgs, max_tokens=10, temperature=0)
    chunks = list(oai(router, "streamed").chat.completions.create(
        model="policy", messages=msgs, max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    a, b = stored(router, "plain"), stored(router, "streamed")
    assert a["tokens"] == b["tokens"] and a["loss_mask"] == b["loss_mask"]
    assert a["logprobs"] == pytest.approx(b["logprobs"], abs=1e-6)


def test_responses_streaming_and_not_agree(router):
    body = dict(model="policy", instructions=SYSTEM, input="Hello there", max_output_tokens=8, temperature=0)
    for tid in ("r1", "r2"):
        router.open_trajectory(tid)
    plain = oai(router, "r1").responses.create(**body)
    events = list(oai(router, "r2").responses.create(**body, stream=True))
    done = [e for e in events if e.type == "response.completed"]
    assert len(done) == 1 and done[0].response.output_text == plain.output_text
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == plain.output_text
    assert stored(router, "r1")["tokens"] == stored(router, "r2")["tokens"]
    assert plain.usage.output_tokens == sum(stored(router, "r1")["loss_mask"])


def test_anthropic_messages_multi_turn_with_moving_cache_control(router, tokenizer):
    router.open_trajectory("claude")
    client = anthropic.Anthropic(base_url=router.base_urls("claude")["anthropic"], api_key="unused", max_retries=0)
    user = {"role": "user", "content": [{"type": "text", "text": "Hello there", "cache_control": {"type": "ephemeral"}}]}
    reminder = {"role": "system", "content": "Remember: be terse."}  # Claude Code sends one inside messages
    first = client.messages.create(model="policy", system=SYSTEM, max_tokens=6, extra_body={"temperature": 0},
                                   messages=[user, reminder])
    held = stored(router, "claude")["tokens"]
    text = first.content[0].text
    user2 = {"role": "user", "content": [{"type": "text", "text": "go on", "cache_control": {"type": "ephemeral"}}]}
    user_plain = {"role": "user", "content": [{"type": "text", "text": "Hello there"}]}
    with client.messages.stream(model="policy", system=SYSTEM, max_tokens=6, extra_body={"temperature": 0},
                                messages=[user_plain, reminder, {"role": "assistant", "content": text}, user2]) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    traj = stored(router, "claude")
    assert len(traj["segments"]) == 1 and traj["tokens"][: len(held)] == held
    assert final.content[0].text == streamed
    assert final.usage.output_tokens + first.usage.output_tokens == sum(traj["loss_mask"])
    assert final.usage.input_tokens == len(traj["tokens"]) - final.usage.output_tokens
    conv = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there"},
            {"role": "system", "content": "Remember: be terse."}, {"role": "assistant", "content": text},
            {"role": "user", "content": "go on"}]
    prefix = render(tokenizer, conv, True)
    assert tokenizer.decode(traj["tokens"]).startswith(prefix)


def test_probes_models_and_api_key_as_trajectory_key(router):
    assert httpx.head(router.url + "/").status_code == 200
    assert httpx.head(router.url + "/t/0").status_code == 200
    assert [m.id for m in openai.OpenAI(base_url=router.url + "/v1", api_key="x").models.list()] == ["policy"]
    router.open_trajectory("keyed", "2")
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="keyed:2", max_retries=0)
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert sum(stored(router, "keyed", "2")["loss_mask"]) >= 1
    listing = httpx.get(router.url + "/v1/trajectories").json()["trajectories"]
    assert {"trajectory_id": "keyed", "attempt_id": "2", "status": "active",
            "num_tokens": len(stored(router, "keyed", "2")["tokens"]), "num_segments": 1} in listing


def test_errors_come_back_in_each_wire_format(router):
    router.open_trajectory("err")
    client = oai(router, "err")
    with pytest.raises(openai.BadRequestError, match="n: only n=1 is supported, got 2"):
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], n=2)
    with pytest.raises(openai.NotFoundError, match="unknown model 'gpt-9'"):
        client.responses.create(model="gpt-9", input="hi")
    with pytest.raises(openai.NotFoundError, match="unknown trajectory 'nope'"):
        oai(router, "nope").chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="more than the model's context of 2048 tokens"):
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi " * 1200}],
                                       max_tokens=8)
    claude = anthropic.Anthropic(base_url=router.base_urls("err")["anthropic"], api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="unsupported content block 'image'") as info:
        claude.messages.create(model="policy", max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x"}}]}])
    assert info.value.body["error"]["type"] == "invalid_request_error"
    bad = httpx.post(router.base_urls("err")["anthropic"] + "/v1/messages", content=b"{not json",
                     headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["type"] == "error"
    assert "malformed JSON body" in bad.json()["error"]["message"]
    assert stored(router, "err")["tokens"] == []  # refused requests store nothing


def test_disconnect_mid_stream_aborts_the_real_engine_request(router, engine_url):
    router.open_trajectory("gone")
    before = httpx.get(engine_url + "/get_load").json()
    body = {"model": "policy", "stream": True, "max_tokens": 1500, "temperature": 0,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there"}]}
    with httpx.stream("POST", router.base_urls("gone")["openai"] + "/chat/completions", json=body) as resp:
        for line in resp.iter_lines():
            if '"content": "' in line and '"content": ""' not in line:
                break
    deadline = time.time() + 10
    while httpx.get(engine_url + "/get_load").json()["running"] and time.time() < deadline:
        time.sleep(0.05)
    after = httpx.get(engine_url + "/get_load").json()
    assert after["running"] == 0 and after["decode_steps"] - before["decode_steps"] < 1500
    assert stored(router, "gone")["tokens"] == []  # the half turn is not kept


def test_max_tokens_beyond_the_context_is_clamped_to_what_is_left(router, make_router, engine_url, tokenizer):
    from loongsage.engines.client import EngineClient

    def prompt_len(n):
        text = render(tokenizer, [{"role": "user", "content": "hi " * n}], True)
        return len(tokenizer.encode(text, add_special_tokens=False))

    n = 1000
    while prompt_len(n) < 2040:  # leave the model only a few tokens of context
        n += 4
    router.open_trajectory("clamp")
    out = oai(router, "clamp").chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi " * n}], max_tokens=32000, temperature=0)
    assert 2040 <= out.usage.prompt_tokens < 2048
    assert out.usage.prompt_tokens + out.usage.completion_tokens <= 2048
    strict = make_router([EngineClient(engine_url)], clamp_max_tokens=False)
    strict.open_trajectory("strict")
    with pytest.raises(openai.BadRequestError, match=r"\+ 32000 new tokens, more than the model's context of 2048"):
        oai(strict, "strict").chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=32000)


def test_concurrent_sessions_each_keep_their_own_exact_tokens(router, tokenizer):
    import asyncio

    n = 12
    for i in range(n):
        router.open_trajectory(f"c{i}")

    async def session(i):
        client = openai.AsyncOpenAI(base_url=router.base_urls(f"c{i}")["openai"], api_key="x", max_retries=0)
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"session {i}"}]
        usage = 0
        for turn in range(2):
            if i % 2:
                text, chunks = "", await client.chat.completions.create(
                    model="policy", messages=msgs, max_tokens=5, temperature=0, stream=True,
                    stream_options={"include_usage": True})
                async for c in chunks:
                    text += c.choices[0].delta.content or "" if c.choices else ""
                    usage += c.usage.completion_tokens if c.usage else 0
            else:
                out = await client.chat.completions.create(model="policy", messages=msgs, max_tokens=5,
                                                           temperature=0)
                text, usage = out.choices[0].message.content, usage + out.usage.completion_tokens
            msgs = msgs + [{"role": "assistant", "content": text}, {"role": "user", "content": f"turn {turn}"}]
        await client.close()
        return usage

    async def main():
        return await asyncio.gather(*(session(i) for i in range(n)))

    usages = asyncio.run(main())
    for i in range(n):
        traj = stored(router, f"c{i}")
        assert len(traj["segments"]) == 1, traj["segments"]
        assert sum(traj["loss_mask"]) == usages[i]
        prompt = render(tokenizer, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"session {i}"}],
                        True)
        assert tokenizer.decode(traj["tokens"]).startswith(prompt)


def test_serve_by_hand_prints_working_urls_and_opens_trajectories_on_use(tiny_model_dir, engine_url):
    import io

    from loongsage.config.compose import load_config
    from loongsage.controller.serve import serve

    out = io.StringIO()
    run = load_config("tiny/grpo", [f"model.path={tiny_model_dir}"])
    router = serve(run, [engine_url], block=False, out=out)
    try:
        text = out.getvalue()
        base = next(w.split("=", 1)[1] for w in text.split() if w.startswith("OPENAI_BASE_URL="))
        client = openai.OpenAI(base_url=base, api_key="x", max_retries=0)
        out = client.chat.completions.create(model="anything", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=3)
        assert stored(router, "demo")["tokens"] and out.usage.completion_tokens >= 1
        assert f"{router.url}/v1/trajectories" in text and "/v1/messages" in text
    finally:
        router.stop()
