"""The embedded rollout engine over real HTTP (uvicorn on 127.0.0.1, a free port) on the tiny
model: logprobs equal a plain HF forward, greedy equals HF ``generate``, batching does not
change results, and abort / pause / continue / stop tokens / weight swaps behave as SGLang's."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from loongsage.engines.client import EngineClient
from loongsage.engines.cpu_threads import denormals_kept
from loongsage.engines.embedded_rollout import EmbeddedRolloutEngine
from loongsage.engines.embedded_rollout.params import SamplingParams
from loongsage.engines.embedded_rollout.scheduler import Request

PROMPTS = [[5, 17, 42, 99, 7], [300, 12], [8, 8, 9, 10, 11, 12, 13, 14, 15, 200, 201], [450]]


@pytest.fixture(scope="module")
def engine(running_engine, tiny_model_dir):
    with running_engine(tiny_model_dir, max_running_requests=8, seed=1) as eng:
        yield eng


@pytest.fixture(scope="module")
def client(engine):
    with EngineClient(engine.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


def hf_logprobs(model, prompt: list[int], output: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        lp = model(ids).logits.float().log_softmax(-1)[0]
    return torch.stack([lp[len(prompt) - 1 + i, t] for i, t in enumerate(output)])


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


async def gather(client, prompts, params_list):
    return await asyncio.gather(*[client.agenerate(p, sp) for p, sp in zip(prompts, params_list)])


def test_sampled_logprobs_equal_hf_forward_in_fp32(client, hf):
    params = [{"max_new_tokens": 24, "temperature": 1.0, "ignore_eos": True}] * len(PROMPTS)
    outs = asyncio.run(gather(client, PROMPTS, params))
    for prompt, out in zip(PROMPTS, outs):
        assert len(out.output_ids) == 24 and out.finish_reason == "length"
        ref = hf_logprobs(hf, prompt, out.output_ids)
        got = torch.tensor(out.output_logprobs)
        assert torch.allclose(got, ref, atol=1e-5, rtol=0), (got - ref).abs().max()


def test_greedy_equals_hf_generate(client, hf):
    for prompt in PROMPTS:
        out = client.generate(prompt, {"max_new_tokens": 20, "temperature": 0, "ignore_eos": True})
        assert out.output_ids == hf_greedy(hf, prompt, 20)


def test_concurrent_batched_requests_equal_sequential(client, engine):
    prompts = PROMPTS + [p[::-1] + [3] for p in PROMPTS]
    params = [{"max_new_tokens": 6 + 5 * i, "temperature": 0, "ignore_eos": True}
              for i in range(len(prompts))]
    sequential = [client.generate(p, sp) for p, sp in zip(prompts, params)]
    engine.scheduler.stats["max_batch"] = 0
    concurrent = asyncio.run(gather(client, prompts, params))
    assert engine.scheduler.stats["max_batch"] >= 4  # they really shared decode steps
    for s, c, sp in zip(sequential, concurrent, params):
        assert c.output_ids == s.output_ids and len(c.output_ids) == sp["max_new_tokens"]
        assert torch.allclose(torch.tensor(c.output_logprobs), torch.tensor(s.output_logprobs),
                              atol=1e-5, rtol=0)


def test_the_decode_thread_flushes_denormals(tiny_model_dir):
    """The decode loop's thread and its pool treat denormal floats as zero
    (``engines.cpu_threads``), as a Ray engine host's compute thread does. The engine is started from a
    fresh thread that keeps denormals, since a new thread copies its creator's setting."""
    own = EmbeddedRolloutEngine(str(tiny_model_dir), max_running_requests=2, seed=1, num_threads=2)
    kept: list[int] = []

    def start_keeping_denormals() -> None:
        torch.set_flush_denormal(False)
        kept.append(denormals_kept())
        own.start()

    starter = threading.Thread(target=start_keeping_denormals)
    starter.start()
    starter.join()
    try:
        assert kept == [1 << 20]  # the starting thread keeps them
        assert own.scheduler.call(denormals_kept).result(timeout=30) == 0
    finally:
        own.stop()


def _request(rid: str) -> Request:
    return Request(rid, [5, 17, 42], SamplingParams(max_new_tokens=4), on_update=lambda n, done: None)


def test_calls_before_start_and_after_stop_fail_at_once_naming_why(tiny_model_dir):
    """A call no decode loop will ever run (the engine not started yet, or stopped) fails at
    once with the reason, and a submitted request finishes with ``abort``; both used to wait
    forever (a Ray actor waiting so hangs the session's shutdown)."""
    own = EmbeddedRolloutEngine(str(tiny_model_dir), max_running_requests=2, seed=1, num_threads=1)
    refused = own.scheduler.call(lambda: None).exception(timeout=5)
    assert "not started; start() the engine first" in str(refused)
    early = _request("early")
    own.scheduler.submit(early)
    assert early.done and early.finish["type"] == "abort" and "not started" in early.finish["message"]
    own.start()
    try:
        assert own.offload() is False  # running: the call reaches the loop (CPU: nothing moves)
    finally:
        own.stop()
    refused = own.scheduler.call(lambda: None).exception(timeout=5)
    assert "stopped; it takes no more calls" in str(refused)
    late = _request("late")
    own.scheduler.submit(late)
    assert late.done and late.finish["type"] == "abort"
    own.stop()  # stopping twice is harmless


def test_what_is_queued_behind_a_stop_is_still_answered(tiny_model_dir):
    """A call and a request queued after ``stop()``'s own command (the loop busy meanwhile) do
    not wait forever: the loop answers the call and finishes the request with ``abort``."""
    own = EmbeddedRolloutEngine(str(tiny_model_dir), max_running_requests=2, seed=1, num_threads=1)
    own.start()
    started, release = threading.Event(), threading.Event()
    busy = own.scheduler.call(lambda: started.set() or release.wait())
    assert started.wait(30)  # the loop is inside the call, so the queue holds only what follows
    stopper = threading.Thread(target=own.stop)
    stopper.start()
    deadline = time.monotonic() + 30
    while own.scheduler._cmds.qsize() < 1 and time.monotonic() < deadline:  # stop()'s command queued
        time.sleep(0.01)
    behind = own.scheduler.call(lambda: "ran")
    request = _request("behind")
    own.scheduler.submit(request)
    release.set()
    stopper.join(timeout=30)
    assert busy.result(timeout=5) is True and behind.result(timeout=5) == "ran"
    assert request.done and request.finish == {"type": "abort", "message": "engine stopped"}
    assert not stopper.is_alive()


def test_a_group_of_identical_prompts_is_prefilled_once(client, engine, hf):
    """Eight samples of one prompt admitted together: one prompt's tokens prefilled, seven shared;
    each sample's logprobs still equal a plain HF forward of its own tokens."""
    prompt = PROMPTS[2]
    engine.scheduler.pause("in_place").result()
    stats = engine.scheduler.stats
    before = (stats["prefills"], stats["prefill_tokens"], stats["prefill_tokens_shared"])
    params = [{"max_new_tokens": 8, "temperature": 1.0, "ignore_eos": True}] * 8

    async def group():
        tasks = [asyncio.create_task(client.agenerate(prompt, sp)) for sp in params]
        while engine.scheduler.load()["waiting"] < 8:  # all queued before the engine admits any
            await asyncio.sleep(0.01)
        engine.scheduler.resume().result()
        return await asyncio.gather(*tasks)

    outs = asyncio.run(group())
    assert stats["prefills"] - before[0] == 1
    assert stats["prefill_tokens"] - before[1] == 8 * len(prompt)
    assert stats["prefill_tokens_shared"] - before[2] == 7 * len(prompt)
    assert len({tuple(o.output_ids) for o in outs}) > 1  # sampled apart after the shared prefill
    for out in outs:
        ref = hf_logprobs(hf, prompt, out.output_ids)
        assert torch.allclose(torch.tensor(out.output_logprobs), ref, atol=1e-5, rtol=0)


def test_a_batched_request_of_one_prompt_is_prefilled_once_and_answered_in_order(client, engine, hf):
    """A group sent as one batched ``/generate`` (what the single-turn agent sends) reaches the
    queue whole: one prefill with no pause to line the requests up, each answer under its rid."""
    prompt = PROMPTS[0]
    stats = engine.scheduler.stats
    before = (stats["prefills"], stats["prefill_tokens_shared"])
    rids = [f"batch-{i}" for i in range(6)]
    outs = asyncio.run(client.agenerate_batch([prompt] * 6, {"max_new_tokens": 6, "temperature": 1.0,
                                                             "ignore_eos": True}, rids=rids))
    assert (stats["prefills"] - before[0], stats["prefill_tokens_shared"] - before[1]) == (1, 5 * len(prompt))
    assert [o.rid for o in outs] == rids and all(len(o.output_ids) == 6 for o in outs)
    for out in outs:
        ref = hf_logprobs(hf, prompt, out.output_ids)
        assert torch.allclose(torch.tensor(out.output_logprobs), ref, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="2 prompts but 1 rids"):
        asyncio.run(client.agenerate_batch([prompt, prompt], {}, rids=["x"]))


def test_a_batched_request_whose_client_goes_away_is_aborted_whole(client, engine):
    """The engine notices the closed connection within its 1 s poll and aborts every request of
    the body at once, not one per poll (a cancelled group of 8 would hold slots for 8 s)."""
    engine.scheduler.pause("in_place").result()
    load = engine.scheduler.load

    async def cancelled() -> list[int]:
        task = asyncio.create_task(client.agenerate_batch([PROMPTS[1]] * 4, {"max_new_tokens": 8},
                                                          rids=[f"gone-{i}" for i in range(4)]))
        while load()["waiting"] < 4:
            await asyncio.sleep(0.01)
        task.cancel()
        seen = []
        while load()["waiting"] and len(seen) < 3000:
            seen.append(load()["waiting"])
            await asyncio.sleep(0.005)
        return seen

    try:
        seen = asyncio.run(cancelled())
    finally:
        engine.scheduler.resume().result()
    assert load()["waiting"] == 0 and set(seen) == {4}  # from 4 waiting straight to none


def test_the_scheduler_aborts_the_requests_it_is_named_in_one_command(engine):
    """``abort(rid, *more)`` takes every named request out of the queue in one command (the
    server's client-gone path names a whole body): a reader between decode steps never sees part
    of them gone; one not named stays."""
    sched = engine.scheduler
    sched.pause("in_place").result()
    kept_done = threading.Event()
    reqs = [_request(f"named-{i}") for i in range(3)]
    reqs[1].on_update = lambda n, done: done and kept_done.set()
    seen: list[int] = []
    try:
        sched.submit(*reqs)
        assert sched.call(lambda: sched.load()["waiting"]).result() == 3
        aborted = sched.abort("named-0", "named-2")
        seen.append(sched.call(lambda: sched.load()["waiting"]).result())  # runs after the abort
        assert aborted.result() == 2
        assert [r.done for r in reqs] == [True, False, True]
        assert all(r.finish["type"] == "abort" for r in (reqs[0], reqs[2]))
    finally:
        sched.resume().result()
    assert seen == [1]
    assert kept_done.wait(30) and reqs[1].finish["type"] == "length"


def test_stop_token_ids_and_max_new_tokens(client, hf):
    prompt = PROMPTS[0]
    ref = hf_greedy(hf, prompt, 12)
    stop = ref[4]
    first = ref.index(stop)
    out = client.generate(prompt, {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True,
                                   "stop_token_ids": [stop]})
    assert out.output_ids == ref[: first + 1]  # the stop token is returned, as in SGLang
    assert out.finish_reason == "stop" and out.matched_stop == stop
    out = client.generate(prompt, {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True})
    assert out.output_ids == ref[:3] and out.finish_reason == "length"
    out = client.generate(prompt, {"max_new_tokens": 0})
    assert out.output_ids == [] and out.finish_reason == "length"


def test_eos_stops_unless_ignored(client, engine, hf):
    """EOS comes from the model's generation config; the stop-token path also serves it."""
    eos = next(iter(engine.scheduler.eos_ids))
    prompt = PROMPTS[1]
    ref = hf_greedy(hf, prompt, 8)
    engine.scheduler.eos_ids.add(ref[2])
    try:
        out = client.generate(prompt, {"max_new_tokens": 8, "temperature": 0})
        assert out.output_ids[-1] == ref[2] and out.finish_reason == "stop"
        out = client.generate(prompt, {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True})
        assert len(out.output_ids) == 8
    finally:
        engine.scheduler.eos_ids.discard(ref[2])
        engine.scheduler.eos_ids.add(eos)


def _wait_running(url: str, n: int = 1, timeout: float = 30.0, finished=lambda: False) -> None:
    """Until ``n`` requests run; ``finished()`` says the awaited request is already done (on a
    busy machine a short one can run and end between two polls, which defeats the test)."""
    deadline = time.monotonic() + timeout
    while httpx.get(url + "/get_load").json()["running"] < n:
        assert not finished(), "the request finished before it was seen running"
        assert time.monotonic() < deadline, "request never started running"
        time.sleep(0.01)


def test_abort_returns_partial_tokens(client, engine):
    async def run():
        task = asyncio.create_task(client.agenerate(
            PROMPTS[0], {"max_new_tokens": 1500, "ignore_eos": True}, rid="victim"))
        await asyncio.to_thread(_wait_running, engine.url)
        await asyncio.sleep(0.2)
        await client.aabort("victim")
        return await task

    out = asyncio.run(run())
    assert out.finish_reason == "abort" and out.rid == "victim"
    assert 0 < len(out.output_ids) < 1500 and len(out.output_logprobs) == len(out.output_ids)


def test_streamed_abort_keeps_tokens_seen(client):
    async def run():
        got, last = [], None
        async for chunk in client.astream_generate(PROMPTS[2], {"max_new_tokens": 1500,
                                                                "ignore_eos": True}, rid="s1"):
            got += chunk.output_ids
            last = chunk
            if len(got) >= 5 and not chunk.finished:
                await client.aabort("s1")
        return got, last

    got, last = asyncio.run(run())
    assert last.finished and last.finish_reason == "abort" and 5 <= len(got) < 1500


def test_pause_in_place_holds_then_continue_finishes_unchanged(client, engine, hf):
    prompt = PROMPTS[2]

    async def run():
        task = asyncio.create_task(client.agenerate(
            prompt, {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True}))
        await asyncio.to_thread(_wait_running, engine.url, finished=task.done)
        await client.apause_generation("in_place")
        load = httpx.get(engine.url + "/get_load").json()
        row = engine.scheduler._rows[0]
        n_paused = len(row.output_ids)
        await asyncio.sleep(0.4)
        held = len(row.output_ids) == n_paused and not task.done()
        flushed_while_busy = await client.aflush_cache()
        await client.acontinue_generation()
        return load, held, flushed_while_busy, await task

    load, held, flushed_while_busy, out = asyncio.run(run())
    assert load["running"] == 1 and held and flushed_while_busy is False
    assert out.finish_reason == "length" and out.output_ids == hf_greedy(hf, prompt, 200)
    assert client.flush_cache() is True


def test_pause_abort_mode_finishes_requests_with_abort(client, engine):
    async def run():
        task = asyncio.create_task(client.agenerate(PROMPTS[0], {"max_new_tokens": 1500,
                                                                 "ignore_eos": True}))
        await asyncio.to_thread(_wait_running, engine.url)
        await client.apause_generation("abort")
        out = await task
        queued = asyncio.create_task(client.agenerate(PROMPTS[1], {"max_new_tokens": 4}))
        await asyncio.sleep(0.2)
        waited = not queued.done()
        await client.acontinue_generation()
        return out, waited, await queued

    out, waited, queued = asyncio.run(run())
    assert out.finish_reason == "abort" and len(out.output_ids) < 1500
    assert waited and queued.finish_reason == "length" and len(queued.output_ids) == 4


@pytest.mark.parametrize("body, field", [
    ({"sampling_params": {"max_new_tokens": 4}}, "input_ids"),
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": [1, 99999]}, "input_ids[1]"),
    ({"input_ids": [1], "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
    ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
    ({"input_ids": [1], "sampling_params": {"top_k": 0}}, "sampling_params.top_k"),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": "many"}},
     "sampling_params.max_new_tokens"),
    ({"input_ids": [1], "sampling_params": {"frequency_penalty": 0.5}},
     "sampling_params.frequency_penalty"),
    ({"input_ids": [1], "sampling_params": {"stop_token_ids": [1, -3]}},
     "sampling_params.stop_token_ids[1]"),
])
def test_bad_requests_are_400_naming_the_field(engine, body, field):
    resp = httpx.post(engine.url + "/generate", json=body)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["field"] == field and err["message"].startswith(field + ":")


def test_a_top_k_beyond_the_vocabulary_is_off_and_fails_no_other_request(engine):
    """Before, top_k = 2**63 passed validation and overflowed the sampler: the decode step
    failed and every request in the batch came back aborted."""
    async def run():
        async with EngineClient(engine.url) as client:
            return await asyncio.gather(
                client.agenerate([1, 2, 3], {"max_new_tokens": 4, "ignore_eos": True, "top_k": 2**63}),
                client.agenerate([4, 5, 6], {"max_new_tokens": 4, "ignore_eos": True}))

    for out in asyncio.run(run()):
        assert out.finish_reason == "length" and len(out.output_ids) == 4


def test_bad_control_requests_are_400(engine):
    resp = httpx.post(engine.url + "/pause_generation", json={"mode": "freeze"})
    assert resp.status_code == 400 and resp.json()["error"]["field"] == "mode"
    resp = httpx.post(engine.url + "/generate", content=b"{not json")
    assert resp.status_code == 400 and "invalid JSON" in resp.json()["error"]["message"]


def test_failed_forward_aborts_its_requests_and_the_engine_recovers(client, engine):
    real = engine.scheduler.head

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    engine.scheduler.head = boom
    try:
        out = client.generate(PROMPTS[0], {"max_new_tokens": 4})
    finally:
        engine.scheduler.head = real
    assert out.finish_reason == "abort" and "boom" in out.meta_info["finish_reason"]["message"]
    assert client.health()
    out = client.generate(PROMPTS[0], {"max_new_tokens": 4, "ignore_eos": True})
    assert out.finish_reason == "length" and len(out.output_ids) == 4


def test_client_gone_before_its_body_is_answered_quietly(engine, client, caplog):
    """A request cancelled while its body is in flight (what shutdown of an async run does)
    is not an application error: no traceback in the server log, and the engine serves on."""
    import logging
    import socket
    from urllib.parse import urlparse

    url = urlparse(engine.url)
    with caplog.at_level(logging.ERROR):
        with socket.create_connection((url.hostname, url.port)) as sock:
            sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"input_ids\": [1,")
            time.sleep(0.2)
        time.sleep(0.5)
        assert client.generate(PROMPTS[1], {"max_new_tokens": 2, "ignore_eos": True}).output_ids
    assert not [r for r in caplog.records if "Exception in ASGI application" in r.getMessage()]
