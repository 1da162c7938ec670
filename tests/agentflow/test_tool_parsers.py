"""Tool parsers (through the registry) and the streaming splitter built on them."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from loongsage.agentflow.tool_calls import StreamSplitter
from loongsage.plugins import get_registries


@pytest.fixture(scope="module")
def parsers():
    reg = get_registries().tool_parser
    return {name: reg.get(name)() for name in ("hermes", "qwen3_xml")}


HERMES = ('Let me look.\n<tool_call>\n{"name": "ls", "arguments": {"path": ".", "all": true}}\n</tool_call>\n'
          '<tool_call>{"name": "cat", "arguments": "{\\"file\\": \\"a.txt\\"}"}</tool_call>')
XML = ("Checking.\n<tool_call>\n<function=exec>\n<parameter=cmd>\nls -la\n</parameter>\n"
       "<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>")


def test_hermes_calls_and_content(parsers):
    out = parsers["hermes"].parse(HERMES)
    assert out.content == "Let me look.\n"
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("ls", {"path": ".", "all": True}), ("cat", {"file": "a.txt"})]
    assert out.tool_calls[0].arguments == '{"path":".","all":true}'  # compact, as OpenCode re-sends it
    assert out.tool_calls[0].id != out.tool_calls[1].id


def test_xml_calls_decode_json_values(parsers):
    out = parsers["qwen3_xml"].parse(XML)
    assert out.content == "Checking.\n"
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [("exec", {"cmd": "ls -la", "timeout": 30})]


@pytest.mark.parametrize("name,text", [("hermes", "<tool_call>{not json}</tool_call>"),
                                       ("qwen3_xml", "<tool_call><oops/></tool_call>")])
def test_unparseable_block_stays_content(parsers, name, text):
    out = parsers[name].parse("hi " + text)
    assert out.tool_calls == [] and out.content == "hi " + text


def test_unterminated_final_block_is_parsed(parsers):
    out = parsers["hermes"].parse('<tool_call>{"name": "ls", "arguments": {}}')
    assert [c.name for c in out.tool_calls] == ["ls"] and out.content == ""


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(HERMES)), max_size=12),
       which=st.sampled_from(["hermes", "qwen3_xml"]))
def test_streaming_any_chunking_matches_the_full_parse(cuts, which):
    parser = get_registries().tool_parser.get(which)()
    text = HERMES if which == "hermes" else XML
    points = sorted({0, len(text), *[min(c, len(text)) for c in cuts]})
    splitter = StreamSplitter(parser)
    streamed = "".join(splitter.feed(text[a:b]) for a, b in zip(points, points[1:]))
    rest, parsed = splitter.finish()
    full = parser.parse(text)
    assert streamed + rest == full.content
    assert "<tool_call>" not in streamed and "<tool_" not in streamed[-7:]
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [(c.name, c.arguments) for c in full.tool_calls]


def test_hermes_writes_calls_exactly_as_the_qwen_template_does(parsers, tokenizer):
    """What SFT writes for a template without tool support is what Qwen-style templates write
    (the tiny model's template is Qwen2.5's layout), byte for byte."""
    from loongsage.agentflow.tool_calls import ToolCall

    calls = [ToolCall.from_args("calculator", {"expression": "345 + 678"}),
             ToolCall.from_args("bash", {"command": "ls", "all": True})]
    message = {"role": "assistant", "content": "",
               "tool_calls": [{"type": "function", "function": {"name": c.name,
                                                                "arguments": c.args_object()}}
                              for c in calls]}
    prompt = [{"role": "user", "content": "go"}]
    full = tokenizer.apply_chat_template(prompt + [message], tokenize=False)
    head = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    assert full == head + parsers["hermes"].render(calls) + "<|im_end|>\n"
