"""Tool calls in each wire format, engine failures, disconnects and replica routing.

These use ``ScriptedEngine`` (conftest) as the engine replica: the random tiny model never
emits a tool call, fails or stalls on demand. The router, SDK clients, chat template,
tokenizer and store are real.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

TOOL_TEXT = '<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>'
ANSWER = "The files are a.txt and b.txt."
RESULT = "a.txt b.txt"
SYSTEM = "Use tools."
LS = {"name": "ls", "description": "List files",
      "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
CHAT_TOOLS = [{"type": "function", "function": LS}]


def stored(router, tid):
    return httpx.get(f"{router.url}/v1/trajectories/{tid}").json()["attempts"][0]


def chat_round(router, stream):
    client = openai.OpenAI(base_url=router.base_urls("t")["openai"], api_key="x", max_retries=0)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "list files"}]
    if stream:
        calls: dict[int, dict] = {}
        for chunk in client.chat.completions.create(model="policy", messages=msgs, tools=CHAT_TOOLS, stream=True):
            for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                c = calls.setdefault(d.index, {"id": d.id, "type": "function", "function": {"name": "", "arguments": ""}})
                c["function"]["name"] += d.function.name or ""
                c["function"]["arguments"] += d.function.arguments or ""
        message = {"role": "assistant", "content": "", "tool_calls": list(calls.values())}
    else:
        out = client.chat.completions.create(model="policy", messages=msgs, tools=CHAT_TOOLS)
        assert out.choices[0].finish_reason == "tool_calls"
        message = out.choices[0].message.model_dump(exclude_none=True)
    (call,) = message["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("ls", {"path": "."})
    call["function"]["arguments"] = json.dumps(json.loads(call["function"]["arguments"]))  # re-serialised
    msgs += [message, {"role": "tool", "tool_call_id": call["id"], "content": RESULT}]
    final = client.chat.completions.create(model="policy", messages=msgs, tools=CHAT_TOOLS)
    return final.choices[0].message.content


def responses_round(router, stream):
    client = openai.OpenAI(base_url=router.base_urls("t")["openai"], api_key="x", max_retries=0)
    tools = [{"type": "function", **LS}, {"type": "web_search"}]
    items = [{"role": "developer", "content": SYSTEM}, {"role": "user", "content": "list files"}]
    if stream:
        events = list(client.responses.create(model="policy", input=items, tools=tools, stream=True))
        out = next(e.response for e in events if e.type == "response.completed")
    else:
        out = client.responses.create(model="policy", input=items, tools=tools)
    (call,) = [o for o in out.output if o.type == "function_call"]
    assert (call.name, json.loads(call.arguments)) == ("ls", {"path": "."})
    items += [o.model_dump(exclude_none=True) for o in out.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": RESULT})
    return client.responses.create(model="policy", input=items, tools=tools).output_text


def messages_round(router, stream):
    client = anthropic.Anthropic(base_url=router.base_urls("t")["anthropic"], api_key="x", max_retries=0)
    tools = [{"name": LS["name"], "description": LS["description"], "input_schema": LS["parameters"]}]
    msgs = [{"role": "user", "content": "list files"}]
    if stream:
        with client.messages.stream(model="policy", system=SYSTEM, max_tokens=64, tools=tools, messages=msgs) as s:
            out = s.get_final_message()
    else:
        out = client.messages.create(model="policy", system=SYSTEM, max_tokens=64, tools=tools, messages=msgs)
    assert out.stop_reason == "tool_use"
    (use,) = [b for b in out.content if b.type == "tool_use"]
    assert (use.name, use.input) == ("ls", {"path": "."})
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in out.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": RESULT}]}]
    final = client.messages.create(model="policy", system=SYSTEM, max_tokens=64, tools=tools, messages=msgs)
    return final.content[0].text


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("round_trip", [chat_round, responses_round, messages_round],
                         ids=["chat", "responses", "messages"])
def test_tool_call_round_trip(make_router, scripted_engine, tokenizer, round_trip, stream):
    engine = scripted_engine([TOOL_TEXT, ANSWER])
    router = make_router([engine])
    router.open_trajectory("t")
    assert round_trip(router, stream) == ANSWER
    traj = stored(router, "t")
    assert len(traj["segments"]) == 1
    # turn 2 was sent to the engine as turn 1's tokens (sampled ones included) + new tokens
    turn1 = engine.prompts[0] + tokenizer.encode(TOOL_TEXT, add_special_tokens=False) + [engine.eos]
    assert engine.prompts[1][: len(turn1)] == turn1 and traj["tokens"][: len(engine.prompts[1])] == engine.prompts[1]
    conv = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "list files"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "ls", "arguments": {"path": "."}}}]},
            {"role": "tool", "content": RESULT}, {"role": "assistant", "content": ANSWER}]
    tools = [{"type": "function", "function": LS}]
    expected = tokenizer.apply_chat_template(conv, tools=tools, tokenize=False)
    assert tokenizer.decode(traj["tokens"]) + "\n" == expected
    sampled = [t for t, m in zip(traj["tokens"], traj["loss_mask"]) if m]
    assert sampled == turn1[len(engine.prompts[0]):] + tokenizer.encode(ANSWER, add_special_tokens=False) + [engine.eos]
    assert {traj["versions"][i] for i, m in enumerate(traj["loss_mask"]) if m} == {3}


def test_engine_failure_is_an_error_to_the_client_and_marks_the_trajectory(make_router, scripted_engine):
    router = make_router([scripted_engine(["a long reply that fails", "x"], fail_after=3)])
    router.open_trajectory("t")
    client = openai.OpenAI(base_url=router.base_urls("t")["openai"], api_key="x", max_retries=0)
    with pytest.raises(openai.APIError, match="scripted engine failure"):
        list(client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], stream=True))
    traj = stored(router, "t")
    assert traj["status"] == "failed" and "scripted engine failure" in traj["error"]
    assert traj["tokens"] == []  # the half turn was rolled back
    claude = anthropic.Anthropic(base_url=router.base_urls("t")["anthropic"], api_key="x", max_retries=0)
    with pytest.raises(anthropic.InternalServerError, match="scripted engine failure"):
        claude.messages.create(model="policy", max_tokens=8, messages=[{"role": "user", "content": "hi"}])


def test_client_disconnect_mid_stream_aborts_the_engine_request(make_router, scripted_engine):
    engine = scripted_engine(["word " * 200], delay=0.02)
    router = make_router([engine])
    router.open_trajectory("t")
    body = {"model": "policy", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", router.base_urls("t")["openai"] + "/chat/completions", json=body) as resp:
        for line in resp.iter_lines():
            if '"content": "w' in line:
                break
    deadline = time.time() + 5
    while not engine.aborted and time.time() < deadline:
        time.sleep(0.05)
    assert engine.aborted == ["t#0#0"]
    traj = stored(router, "t")
    assert traj["tokens"] == [] and traj["status"] == "active"


def test_sticky_per_trajectory_and_least_loaded_for_new_ones(make_router, scripted_engine):
    engines = [scripted_engine(["one", "two"]), scripted_engine(["three", "four"])]
    router = make_router(engines)
    for tid in ("a", "b"):
        router.open_trajectory(tid)
    def ask(tid, history):
        client = openai.OpenAI(base_url=router.base_urls(tid)["openai"], api_key="x", max_retries=0)
        return client.chat.completions.create(model="policy", messages=history).choices[0].message.content
    first_a = ask("a", [{"role": "user", "content": "hi"}])
    first_b = ask("b", [{"role": "user", "content": "hi"}])
    ask("a", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": first_a},
              {"role": "user", "content": "more"}])
    assert (first_a, first_b) == ("one", "three")  # b went to the replica with fewer sessions
    assert len(engines[0].prompts) == 2 and len(engines[1].prompts) == 1  # a stayed on replica 0


def test_subagent_header_opens_a_child_segment(make_router, scripted_engine):
    router = make_router([scripted_engine(["parent", "child"])], middlewares=["agent_sessions"])
    router.open_trajectory("t")
    client = openai.OpenAI(base_url=router.base_urls("t")["openai"], api_key="x", max_retries=0)
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "main task"}],
                                   extra_headers={"session-id": "s1"})
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "sub task"}],
                                   extra_headers={"x-openai-subagent": "collab_spawn"})
    traj = stored(router, "t")
    assert [(s["origin"], s["parent"]) for s in traj["segments"]] == [("root", None), ("subagent", 0)]
    assert traj["active_segment"] == 0 and traj["metadata"]["agent_headers"]["session-id"] == "s1"
    samples = router.finish_trajectory("t", reward=1.0)
    assert [s.reward_info["origin"] for s in samples] == ["root", "subagent"]


def test_unknown_middleware_names_the_config_key():
    from loongsage.config.router_plugins import resolve_router_plugins
    from loongsage.errors import UnknownPluginError
    from loongsage.plugins import get_registries

    with pytest.raises(UnknownPluginError, match=r"agentflow.middlewares\[0\]: unknown router_middleware 'agent_sesions'.*'agent_sessions'"):
        resolve_router_plugins(get_registries(), middlewares=["agent_sesions"])


def test_untrained_model_calls_never_become_samples_or_the_mainline(make_router, scripted_engine):
    router = make_router([scripted_engine(["A title", "work"])], untrained_models=["title"])
    router.open_trajectory("t")
    client = openai.OpenAI(base_url=router.base_urls("t")["openai"], api_key="x", max_retries=0)
    client.chat.completions.create(model="title", messages=[{"role": "user", "content": "Title for: fix bug"}])
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "fix bug"}],
                                   tools=CHAT_TOOLS)
    traj = stored(router, "t")
    assert [(s["origin"], s["trainable"]) for s in traj["segments"]] == [("compact", False), ("root", True)]
    assert traj["active_segment"] == 1
    (sample,) = router.finish_trajectory("t", reward=1.0)
    assert sample.reward_info["segment_id"] == 1


def test_anthropic_count_tokens_is_the_template_length(make_router, scripted_engine, tokenizer):
    router = make_router([scripted_engine([])])
    client = anthropic.Anthropic(base_url=router.url, api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "how many tokens?"}]
    counted = client.messages.count_tokens(model="policy", system=SYSTEM, messages=msgs)
    text = tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}, *msgs], tokenize=False,
                                         add_generation_prompt=True)
    assert counted.input_tokens == len(tokenizer.encode(text, add_special_tokens=False))


def test_opencode_child_session_is_a_subagent(make_router, scripted_engine):
    router = make_router([scripted_engine(["main", "child", "main again"])], middlewares=["agent_sessions"])
    router.open_trajectory("t")
    client = openai.OpenAI(base_url=router.base_urls("t")["openai"], api_key="x", max_retries=0)
    main = [{"role": "user", "content": "main task"}]
    client.chat.completions.create(model="policy", messages=main, extra_headers={"x-session-id": "ses_1"})
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "explore"}],
                                   extra_headers={"x-session-id": "ses_2"})
    client.chat.completions.create(model="policy", extra_headers={"x-session-id": "ses_1"},
                                   messages=main + [{"role": "assistant", "content": "main"},
                                                    {"role": "user", "content": "continue"}])
    traj = stored(router, "t")
    assert [(s["origin"], s["num_turns"]) for s in traj["segments"]] == [("root", 2), ("subagent", 1)]


@pytest.mark.parametrize("spec", ["tool_call_parser", {"name": "tool_call_parser", "parser": "qwen3_xml"}])
def test_parser_middleware_params_choose_the_parser(make_router, scripted_engine, spec):
    xml = "<tool_call>\n<function=ls>\n<parameter=path>\n.\n</parameter>\n</function>\n</tool_call>"
    router = make_router([scripted_engine([xml])], middlewares=[spec],
                         tool_parser="hermes" if isinstance(spec, dict) else "qwen3_xml")
    router.open_trajectory("t")
    client = openai.OpenAI(base_url=router.base_urls("t")["openai"], api_key="x", max_retries=0)
    out = client.chat.completions.create(model="policy", tools=CHAT_TOOLS,
                                         messages=[{"role": "user", "content": "list"}])
    (call,) = out.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("ls", {"path": "."})


def test_requests_beyond_max_inflight_wait_in_the_router(make_router, scripted_engine):
    import asyncio

    engine = scripted_engine(["slow reply"] * 6, delay=0.01)
    router = make_router([engine], max_inflight_per_engine=2)

    async def one(i):
        router.open_trajectory(f"q{i}")
        client = openai.AsyncOpenAI(base_url=router.base_urls(f"q{i}")["openai"], api_key="x", max_retries=0)
        stream = await client.chat.completions.create(model="policy", stream=True,
                                                      messages=[{"role": "user", "content": "hi"}])
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        await client.close()
        return text

    async def main():
        return await asyncio.gather(*(one(i) for i in range(6)))

    assert asyncio.run(main()) == ["slow reply"] * 6
    assert engine.max_running == 2


def test_a_prepared_turn_whose_stream_never_starts_is_undone(make_router, scripted_engine):
    """What the streaming response's background task does when the client left before the
    first byte (the event generator never ran)."""
    import asyncio

    from loongsage.agentflow.middleware import TurnContext
    from loongsage.agentflow.protocols import OpenAIChatAdapter

    router = make_router([scripted_engine(["x", "y"])])
    traj = router.open_trajectory("t")
    request = OpenAIChatAdapter().parse_request({"model": "policy", "stream": True,
                                                 "messages": [{"role": "user", "content": "hi"}]})
    turn = asyncio.run(router.runner.prepare(TurnContext(request=request, headers={}, trajectory=traj)))
    assert traj.tokens and traj.segments[0].messages
    asyncio.run(router.runner.abandon(turn))
    assert traj.tokens == [] and traj.segments[0].messages == []
    client = openai.OpenAI(base_url=router.base_urls("t")["openai"], api_key="x", max_retries=0)
    out = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    assert out.choices[0].message.content == "x" and len(stored(router, "t")["segments"]) == 1
