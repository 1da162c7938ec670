"""Contract tests, parametrised over every registered entry of every kind.

Whatever distribution registered an entry, it must honour its kind's contract
(docs/plugins.md §4). Advantage estimators, policy losses, IS corrections and KL policies
are checked in ``tests/algorithms/test_contracts.py`` with ``loongsage.algorithms.testing``
(which third-party authors run on their own plugins); every other kind is checked here.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from tool_guard import optional_skip

from loongsage.plugins import get_registries
from loongsage.registry import KINDS

REGISTRIES = get_registries()


def entries(kind: str):
    return [pytest.param(e, id=e.name) for e in REGISTRIES[kind]]


def default_params(entry):
    """The entry's parameters with defaults, or None when a required field has no default."""
    if entry.params is None:
        return None
    required = [
        f for f in dataclasses.fields(entry.params)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
    ]
    if required:
        return None
    params = entry.params()
    if any(getattr(params, f.name) == "???" for f in dataclasses.fields(params)):
        return None
    return params


def test_every_kind_has_at_least_one_entry():
    assert [k for k in KINDS if len(REGISTRIES[k]) == 0] == []


@pytest.mark.parametrize("entry", entries("data_filter"))
def test_data_filter_contract(entry):
    """loongsage_register_data_filters: a filter of no groups keeps no groups."""
    result = entry.obj([], default_params(entry))
    assert result.groups == [] and all(isinstance(v, float) for v in result.metrics.values())


@pytest.mark.parametrize("entry", entries("reward"))
def test_reward_contract(entry):
    """loongsage_register_rewards: reward(sample_text, ground_truth, params, **context)."""
    signature = inspect.signature(entry.obj)
    signature.bind("text", "truth", default_params(entry), prompt=None, sample=None)


@pytest.mark.parametrize("entry", entries("dataset"))
def test_dataset_contract(entry):
    """loongsage_register_datasets: cls(params, seed) with get(index) -> Prompt."""
    assert callable(getattr(entry.obj, "get", None))
    params = default_params(entry)
    if params is None:
        optional_skip(f"dataset '{entry.name}' needs a file; its own tests read real files")
    from loongsage.data.types import Prompt

    first = entry.obj(params, seed=0).get(0)
    assert isinstance(first, Prompt) and first.messages
    assert entry.obj(params, seed=0).get(0) == first


@pytest.mark.parametrize("entry", entries("agent"))
def test_agent_contract(entry):
    """loongsage_register_agents: cls(params, tokenizer) with async run_group."""
    assert inspect.iscoroutinefunction(entry.obj.run_group)
    inspect.signature(entry.obj).bind(default_params(entry), None)


@pytest.mark.parametrize("entry", entries("sandbox"))
def test_sandbox_contract(entry):
    """loongsage_register_sandboxes: an async context manager with exec and a files API."""
    for method in ("exec", "write_file", "read_file", "list_files", "reset", "close", "__aenter__"):
        assert inspect.iscoroutinefunction(getattr(entry.obj, method)), method
    assert callable(entry.obj.pool)


@pytest.mark.parametrize("entry", entries("tool_parser"))
def test_tool_parser_contract(entry):
    """loongsage_register_tool_parsers: plain text parses to itself with no tool calls, and
    rendered calls parse back to the same calls."""
    from loongsage.agentflow.tool_calls import ToolCall

    parser = entry.obj()
    assert isinstance(parser.start_marker, str) and parser.start_marker
    parsed = parser.parse("The answer is 4.")
    assert (parsed.content, parsed.tool_calls) == ("The answer is 4.", [])
    calls = [ToolCall.from_args("calculator", {"expression": "345 + 678"}),
             ToolCall.from_args("bash", {"command": "ls -la\necho 'x'", "timeout": 5})]
    parsed = parser.parse(parser.render(calls))
    assert parsed.content == ""
    assert [(c.name, c.args_object()) for c in parsed.tool_calls] == \
        [(c.name, c.args_object()) for c in calls]


@pytest.mark.parametrize("entry", entries("router_middleware"))
def test_router_middleware_contract(entry):
    """loongsage_register_router_middlewares: subclasses of RouterMiddleware."""
    from loongsage.agentflow.middleware import RouterMiddleware

    assert issubclass(entry.obj, RouterMiddleware)


@pytest.mark.parametrize("entry", entries("window_policy"))
def test_window_policy_contract(entry):
    """loongsage_register_window_policies: subclasses of WindowPolicy built from params."""
    from loongsage.runtime.window import WindowPolicy

    assert isinstance(entry.obj(default_params(entry)), WindowPolicy)


@pytest.mark.parametrize("entry", entries("engine"))
def test_engine_contract(entry):
    """loongsage_register_engines: classes built by from_config(cfg) inside a Ray actor."""
    assert callable(getattr(entry.obj, "from_config", None))


@pytest.mark.parametrize("entry", entries("tracker"))
def test_tracker_contract(entry, tmp_path):
    """loongsage_register_trackers: cls(params, run_dir, config); log; close."""
    from loongsage.tracking.base import Tracker

    tracker = entry.obj(default_params(entry), tmp_path, {})
    assert isinstance(tracker, Tracker)
    tracker.log({"rollout/reward_mean": 0.5}, 0)
    tracker.close()
