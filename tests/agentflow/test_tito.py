"""TITO turn building with the tiny model's real tokenizer and ChatML template.

"Sampled" turns here are token ids chosen by the test (the engine's part is tested in the
router tests); what is checked is that history is matched, never re-tokenized, and that the
stored tokens decode to the template's rendering of the conversation.
"""

from __future__ import annotations

import copy

import pytest

from loongsage.agentflow.errors import RequestError
from loongsage.agentflow.messages import ChatRequest
from loongsage.agentflow.protocols import AnthropicMessagesAdapter
from loongsage.agentflow.store import Trajectory
from loongsage.agentflow.tito import ChatRenderer, plan_turn, record_generation

SYSTEM = {"role": "system", "content": "You are a careful assistant."}
TOOLS = [{"type": "function", "function": {"name": "ls", "description": "List files",
                                            "parameters": {"type": "object",
                                                           "properties": {"path": {"type": "string"}}}}}]


@pytest.fixture
def renderer(tokenizer):
    return ChatRenderer(tokenizer)


def sample(traj, plan, tokenizer, ids, message, eos=True):
    """Record ``ids`` (+ end-of-turn) as the model's reply to ``plan``."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = list(ids) + ([end] if eos else [])
    record_generation(traj, plan.segment, out, [-0.5] * len(out), [7] * len(out),
                      "stop" if eos else "length", message, "<|im_end|>" if eos else "")
    return out


def template(tokenizer, messages, tools=None, generation=False):
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=generation)


def test_first_turn_is_the_template_rendering(tokenizer, renderer):
    traj = Trajectory("t", "0")
    msgs = [SYSTEM, {"role": "user", "content": "hi there"}]
    plan = plan_turn(traj, ChatRequest("openai_chat", "m", msgs), renderer)
    assert plan.segment.origin == "root"
    assert plan.prompt_ids == tokenizer.encode(template(tokenizer, msgs, generation=True), add_special_tokens=False)
    assert traj.loss_mask == [0] * len(plan.prompt_ids)


def test_turn_two_appends_only_new_tokens_and_keeps_sampled_ids(tokenizer, renderer):
    traj = Trajectory("t", "0")
    msgs = [SYSTEM, {"role": "user", "content": "what is the answer"}]
    plan1 = plan_turn(traj, ChatRequest("openai_chat", "m", msgs), renderer)
    # a tokenisation of the reply that re-tokenising its text would not produce
    sampled = tokenizer.encode("the ans", add_special_tokens=False) + tokenizer.encode("wer is", add_special_tokens=False)
    assert sampled != tokenizer.encode("the answer is", add_special_tokens=False)
    out = sample(traj, plan1, tokenizer, sampled, {"role": "assistant", "content": "the answer is"})
    held = list(traj.tokens)

    msgs2 = msgs + [{"role": "assistant", "content": "the answer is"}, {"role": "user", "content": "again"}]
    plan2 = plan_turn(traj, ChatRequest("openai_chat", "m", msgs2), renderer)
    assert plan2.segment is plan1.segment and len(traj.segments) == 1
    assert traj.tokens[: len(held)] == held  # nothing held was re-tokenized
    assert traj.tokens[len(plan1.prompt_ids): len(plan1.prompt_ids) + len(out)] == out
    assert renderer.decode(traj.tokens) == template(tokenizer, msgs2, generation=True)
    # the full re-tokenisation differs: incremental tokens are not a re-render
    assert traj.tokens != tokenizer.encode(template(tokenizer, msgs2, generation=True), add_special_tokens=False)
    assert sum(traj.loss_mask) == len(out)
    assert [traj.versions[i] for i, m in enumerate(traj.loss_mask) if m] == [7] * len(out)


def test_length_cut_turn_is_closed_with_the_template_end_of_turn(tokenizer, renderer):
    traj = Trajectory("t", "0")
    msgs = [{"role": "user", "content": "count"}]
    plan = plan_turn(traj, ChatRequest("openai_chat", "m", msgs), renderer)
    sample(traj, plan, tokenizer, tokenizer.encode("one two", add_special_tokens=False),
           {"role": "assistant", "content": "one two"}, eos=False)
    msgs2 = msgs + [{"role": "assistant", "content": "one two"}, {"role": "user", "content": "go on"}]
    plan_turn(traj, ChatRequest("openai_chat", "m", msgs2), renderer)
    assert renderer.decode(traj.tokens) == template(tokenizer, msgs2, generation=True)
    assert sum(traj.loss_mask) == len(tokenizer.encode("one two", add_special_tokens=False))


def test_reserialised_tool_call_json_and_new_ids_keep_the_prefix(tokenizer, renderer):
    traj = Trajectory("t", "0")
    msgs = [SYSTEM, {"role": "user", "content": "list the files"}]
    plan1 = plan_turn(traj, ChatRequest("openai_chat", "m", msgs, tools=TOOLS), renderer)
    text = '<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>'
    call = {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}
    sample(traj, plan1, tokenizer, tokenizer.encode(text, add_special_tokens=False),
           {"role": "assistant", "content": "", "tool_calls": [call]})
    held = list(traj.tokens)
    # OpenCode: arguments re-serialised compactly; other clients: a different call id
    echoed = {"id": "other", "type": "function", "function": {"name": "ls", "arguments": '{"path":"."}'}}
    msgs2 = msgs + [{"role": "assistant", "content": None, "tool_calls": [echoed]},
                    {"role": "tool", "tool_call_id": "other", "content": "a.txt b.txt"}]
    plan2 = plan_turn(traj, ChatRequest("openai_chat", "m", msgs2, tools=TOOLS), renderer)
    assert plan2.segment is plan1.segment
    assert traj.tokens[: len(held)] == held
    # the stored tokens hold the call as the model sampled it, not as the client re-sent it
    as_sampled = msgs + [{"role": "assistant", "content": "", "tool_calls": [call]}, msgs2[-1]]
    assert renderer.decode(traj.tokens) == template(tokenizer, as_sampled, tools=TOOLS, generation=True)


def test_dropped_assistant_turn_forks_after_the_last_shared_message(tokenizer, renderer):
    traj = Trajectory("t", "0")
    u1, a1 = {"role": "user", "content": "first"}, {"role": "assistant", "content": "one"}
    u2, a2 = {"role": "user", "content": "second"}, {"role": "assistant", "content": "two"}
    plan = plan_turn(traj, ChatRequest("openai_chat", "m", [SYSTEM, u1]), renderer)
    first = sample(traj, plan, tokenizer, tokenizer.encode("one", add_special_tokens=False), a1)
    plan = plan_turn(traj, ChatRequest("openai_chat", "m", [SYSTEM, u1, a1, u2]), renderer)
    sample(traj, plan, tokenizer, tokenizer.encode("two", add_special_tokens=False), a2)
    a1_end = plan.segment.message_ends[2]
    # mini-swe-agent drops the tool-less reply a2 and sends an error turn instead
    u3 = {"role": "user", "content": "Tool call error: please call a tool"}
    conv = [SYSTEM, u1, a1, u2, u3]
    plan3 = plan_turn(traj, ChatRequest("openai_chat", "m", conv), renderer)
    fork = plan3.segment
    assert (fork.origin, fork.parent, plan3.forked) == ("compact", 0, True)
    # shared by index, not copied: everything up to the end of u2 (its rendering is an exact
    # token prefix of what the root holds), past the last shared sampled turn a1
    u2_end = len(tokenizer.encode(template(tokenizer, conv[:4]), add_special_tokens=False))
    assert a1_end < u2_end < len(traj.tokens)
    assert fork.spans[0] == [0, u2_end] and fork.shared_len == u2_end
    assert renderer.decode(traj.segment_tokens(fork)) == template(tokenizer, conv, generation=True)
    sample(traj, plan3, tokenizer, tokenizer.encode("three", add_special_tokens=False),
           {"role": "assistant", "content": "three"})
    samples = traj.to_samples(reward=1.0)
    assert len(samples) == 2
    # the fork's sample trains only its own reply; the shared "one" is in its prompt
    assert sum(samples[1].loss_mask) == len(tokenizer.encode("three", add_special_tokens=False)) + 1
    assert samples[1].prompt_ids[: u2_end] == traj.tokens[:u2_end]
    assert sum(samples[0].loss_mask) == len(first) + len(tokenizer.encode("two", add_special_tokens=False)) + 1


def test_divergent_history_opens_a_compact_segment_sharing_only_the_system_prompt(tokenizer,
                                                                                 renderer):
    traj = Trajectory("t", "0")
    msgs = [SYSTEM, {"role": "user", "content": "a long task"}]
    plan = plan_turn(traj, ChatRequest("openai_chat", "m", msgs), renderer)
    sample(traj, plan, tokenizer, tokenizer.encode("working", add_special_tokens=False),
           {"role": "assistant", "content": "working"})
    compacted = [SYSTEM, {"role": "user", "content": "Summary of the work so far: working"}]
    plan2 = plan_turn(traj, ChatRequest("openai_chat", "m", compacted), renderer)
    seg = plan2.segment
    system_len = len(tokenizer.encode(template(tokenizer, [SYSTEM]), add_special_tokens=False))
    assert (seg.origin, seg.parent, seg.shared_len) == ("compact", 0, system_len)
    assert traj.active_segment == seg.segment_id
    assert renderer.decode(traj.segment_tokens(seg)) == template(tokenizer, compacted, generation=True)


def test_subagent_requests_open_a_child_segment_and_keep_the_parent_active(tokenizer, renderer):
    traj = Trajectory("t", "0")
    plan = plan_turn(traj, ChatRequest("openai_chat", "m", [SYSTEM, {"role": "user", "content": "parent"}]), renderer)
    sample(traj, plan, tokenizer, tokenizer.encode("spawn", add_special_tokens=False),
           {"role": "assistant", "content": "spawn"})
    child = plan_turn(traj, ChatRequest("openai_chat", "m", [{"role": "user", "content": "child task"}]),
                      renderer, subagent=True)
    assert (child.segment.origin, child.segment.parent, traj.active_segment) == ("subagent", 0, 0)
    sample(traj, child, tokenizer, tokenizer.encode("done", add_special_tokens=False),
           {"role": "assistant", "content": "done"})
    assert [s.reward_info["origin"] for s in traj.to_samples()] == ["root", "subagent"]


def test_anthropic_moved_cache_control_and_mid_conversation_system_match(tokenizer, renderer):
    adapter = AnthropicMessagesAdapter()
    body = {"model": "m", "max_tokens": 16, "system": [{"type": "text", "text": "sys"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "do it",
                                                       "cache_control": {"type": "ephemeral"}}]},
                         {"role": "system", "content": "reminder: be brief"}]}
    traj = Trajectory("t", "0")
    plan = plan_turn(traj, adapter.parse_request(body), renderer)
    sample(traj, plan, tokenizer, tokenizer.encode("ok", add_special_tokens=False),
           {"role": "assistant", "content": "ok"})
    held = list(traj.tokens)
    body2 = copy.deepcopy(body)
    body2["messages"][0]["content"][0].pop("cache_control")
    body2["messages"] += [{"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                                            {"type": "text", "text": "ok"}]},
                          {"role": "user", "content": [{"type": "text", "text": "next",
                                                        "cache_control": {"type": "ephemeral"}}]}]
    plan2 = plan_turn(traj, adapter.parse_request(body2), renderer)
    assert plan2.segment is plan.segment and traj.tokens[: len(held)] == held
    conv = [{"role": "system", "content": "sys"}, {"role": "user", "content": "do it"},
            {"role": "system", "content": "reminder: be brief"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "next"}]
    assert renderer.decode(traj.tokens) == template(tokenizer, conv, generation=True)


def test_oversize_context_is_refused_with_the_numbers(tokenizer, renderer):
    traj = Trajectory("t", "0")
    with pytest.raises(RequestError, match=r"needs \d+ prompt tokens \+ 64 new tokens, more than .* 32 tokens"):
        plan_turn(traj, ChatRequest("openai_chat", "m", [{"role": "user", "content": "x" * 50}]),
                  renderer, max_context=32, max_new=64)
    assert traj.segments == [] and traj.tokens == [] and traj.active_segment is None


def test_templates_that_rerender_old_turns_still_extend_the_segment(tiny_model_dir):
    """A Qwen3-like template drops the reasoning of turns before the last user message."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = (
        "{%- set ns = namespace(last=-1) %}{%- for m in messages %}{%- if m['role'] == 'user' %}"
        "{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}"
        "{%- for m in messages %}{%- set c = m['content'] %}"
        "{%- if m['role'] == 'assistant' and loop.index0 < ns.last %}{%- set c = c.split('</think>')[-1] %}{%- endif %}"
        "{{- '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
    renderer = ChatRenderer(tok)
    traj = Trajectory("t", "0")
    msgs = [{"role": "user", "content": "q1"}]
    plan = plan_turn(traj, ChatRequest("openai_chat", "m", msgs), renderer)
    reply = "<think>hm</think>ok"
    sample(traj, plan, tok, tok.encode(reply, add_special_tokens=False), {"role": "assistant", "content": reply})
    held = list(traj.tokens)
    msgs2 = msgs + [{"role": "assistant", "content": reply}, {"role": "user", "content": "q2"}]
    plan2 = plan_turn(traj, ChatRequest("openai_chat", "m", msgs2), renderer)
    assert plan2.segment is plan.segment and len(traj.segments) == 1
    assert traj.tokens[: len(held)] == held  # the sampled reasoning stays as sampled
    assert renderer.decode(traj.tokens) == (
        "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>hm</think>ok<|im_end|>\n"
        "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n")
