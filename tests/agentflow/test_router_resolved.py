"""The router looks no plugin up: config validation resolves its middleware chain and its tool
parser once (``RunConfig.router``) and the router is built from those alone.

``ScriptedEngine`` (conftest) is the engine replica, so the model "writes" the probe parser's
tool-call syntax; the config composition and validation, the router, the ``openai`` SDK client,
the chat template and the store are real. Every by-name lookup goes through
``Registry.entry`` (``Registries.resolve``, ``resolve_all`` and ``Registry.get`` call it), so
counting its calls counts them all.
"""

from __future__ import annotations

import json

import pytest

from loongsage import hookimpl
from loongsage.agentflow.middleware import RouterMiddleware
from loongsage.agentflow.server import Router, build_middlewares
from loongsage.agentflow.settings import RouterSettings
from loongsage.config.compose import load_config
from loongsage.errors import UnknownPluginError
from loongsage.registry import Registry

from router_probes import LS, CallLineParser, TagParams

openai = pytest.importorskip("openai")


class Probe:
    """The run's plugin: the ``call_line`` parser and a ``tagging`` middleware that records
    its tag and the parser the router's settings build, once per turn."""

    def __init__(self) -> None:
        self.turns: list[tuple[str, str]] = []

    @hookimpl
    def loongsage_register_tool_parsers(self, register):
        register("call_line", CallLineParser)

    @hookimpl
    def loongsage_register_router_middlewares(self, register):
        turns = self.turns

        class Tagging(RouterMiddleware):
            def __init__(self, settings, params: TagParams):
                self.tag, self.parser = params.tag, type(settings.make_parser()).__name__

            def on_result(self, ctx, result) -> None:
                turns.append((self.tag, self.parser))

        register("tagging", Tagging, params=TagParams)


@pytest.fixture
def lookups(monkeypatch):
    """The by-name lookups made once the fixture is asked for: (kind, name) each."""
    seen: list[tuple[str, str]] = []
    entry = Registry.entry

    def counting(self, name, key=None):
        seen.append((self.kind, name))
        return entry(self, name, key)

    monkeypatch.setattr(Registry, "entry", counting)
    return seen


@pytest.mark.calls_hook("loongsage_register_tool_parsers", "loongsage_register_router_middlewares")
def test_a_validated_run_builds_and_serves_its_router_without_one_lookup(request, scripted_engine, tokenizer):
    probe = Probe()
    run = load_config("tiny/grpo", ["agentflow.tool_parser=call_line",
                                    "agentflow.middlewares=[{name: tagging, tag: seen}, agent_sessions]"],
                      extra_plugins=[(probe, "probe-router-resolved")])
    assert [(m.name, m.params) for m in run.router.middlewares] == [("tagging", TagParams("seen")),
                                                                     ("agent_sessions", None)]
    assert run.router.tool_parser.name == "call_line"
    lookups = request.getfixturevalue("lookups")  # from here on nothing may look a name up
    router = Router([scripted_engine(['Let me look. CALL ls {"path": "src"}'])], tokenizer,
                    RouterSettings.from_config(run.cfg.agentflow, run.router))
    router.start()
    try:
        router.open_trajectory("t")
        client = openai.OpenAI(base_url=router.base_urls("t")["openai"], api_key="x", max_retries=0)
        out = client.chat.completions.create(model="policy", tools=[LS],
                                             messages=[{"role": "user", "content": "ls"}])
    finally:
        router.stop()
    (call,) = out.choices[0].message.tool_calls
    assert (out.choices[0].message.content.strip(), call.function.name, json.loads(call.function.arguments)) == \
        ("Let me look.", "ls", {"path": "src"})
    assert probe.turns == [("seen", "CallLineParser")]
    assert [type(m).__name__ for m in router.runner.middlewares] == \
        ["Tagging", "AgentSessionsMiddleware", "ToolCallParserMiddleware"]
    assert lookups == []


@pytest.mark.calls_hook("loongsage_register_tool_parsers")
def test_the_parser_middlewares_parser_is_resolved_by_validation():
    """``tool_call_parser``'s ``parser`` names a plugin too: validation resolves it (the router's
    tool parser; SFT keeps ``agentflow.tool_parser``) and a misspelt one fails there, naming its
    key, before any router or actor starts."""
    probe = Probe()
    run = load_config("tiny/grpo", ["agentflow.middlewares=[{name: tool_call_parser, parser: call_line}]"],
                      extra_plugins=[(probe, "probe-router-resolved")])
    assert (run.router.tool_parser.name, run.tool_parser.name) == ("call_line", "hermes")
    (parser_middleware,) = build_middlewares(RouterSettings.from_config(run.cfg.agentflow, run.router))
    assert isinstance(parser_middleware.parser, CallLineParser)
    with pytest.raises(UnknownPluginError, match=r"agentflow.middlewares\[0\].parser: unknown tool_parser 'cal_line'"):
        load_config("tiny/grpo", ["agentflow.middlewares=[{name: tool_call_parser, parser: cal_line}]"],
                    extra_plugins=[(probe, "probe-router-resolved")])
