"""A tool parser and a router middleware from a run-time plugin serve real router requests.

``ScriptedEngine`` (conftest) is the engine replica, so the model "writes" the probe
parser's own tool-call syntax; router, SDK client, chat template and store are real.
"""

from __future__ import annotations

import json

import pytest

from loongsage import hookimpl
from loongsage.agentflow.middleware import RouterMiddleware
from loongsage.plugins import load_plugins

from router_probes import LS, CallLineParser, TagParams

openai = pytest.importorskip("openai")


class Probe:
    """The plugin: one tool parser, one middleware that records each turn's completion length."""

    def __init__(self) -> None:
        self.turns: list[tuple[str, int]] = []

    @hookimpl
    def loongsage_register_tool_parsers(self, register):
        register("call_line", CallLineParser)

    @hookimpl
    def loongsage_register_router_middlewares(self, register):
        turns = self.turns

        class Tagging(RouterMiddleware):
            def __init__(self, settings, params: TagParams):
                self.tag = params.tag

            def on_result(self, ctx, result) -> None:
                turns.append((self.tag, result.completion_tokens))

        register("tagging", Tagging, params=TagParams)


@pytest.mark.calls_hook("loongsage_register_tool_parsers", "loongsage_register_router_middlewares")
def test_plugin_parser_and_middleware_serve_a_tool_call(make_router, scripted_engine, tokenizer):
    probe = Probe()
    registries = load_plugins(extra=[(probe, "probe-agentflow")])
    reply = 'Let me look. CALL ls {"path": "src"}'
    router = make_router(
        [scripted_engine([reply])],
        registries=registries,
        tool_parser="call_line",
        middlewares=[{"name": "tagging", "tag": "seen"}],
    )
    router.open_trajectory("t")
    client = openai.OpenAI(base_url=router.base_urls("t")["openai"], api_key="x", max_retries=0)
    out = client.chat.completions.create(
        model="policy", tools=[LS], messages=[{"role": "user", "content": "ls"}]
    )
    message = out.choices[0].message
    assert (
        out.choices[0].finish_reason == "tool_calls" and message.content.strip() == "Let me look."
    )
    (call,) = message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("ls", {"path": "src"})
    eos = 1  # the scripted engine ends every reply with the end-of-turn token
    assert probe.turns == [("seen", len(tokenizer.encode(reply, add_special_tokens=False)) + eos)]
