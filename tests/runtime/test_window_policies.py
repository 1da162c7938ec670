"""Window policies: registration, typed parameters, each gate's decisions, custom policies."""

from __future__ import annotations

import pytest

from loongsage import hookimpl
from loongsage.errors import ConfigError, UnknownPluginError
from loongsage.plugins import get_registries, load_plugins
from loongsage.runtime.pipeline import Pipeline
from loongsage.runtime.window import NoWindow, WindowedFifo, WindowGated, WindowPolicy, WindowView
from runtime_sim import make_source, start_group, window_policy


def view(**kw) -> WindowView:
    base = dict(batch_size=4, stale_steps=1, capacity=8, in_flight=0, buffered=0, training=0,
                next_seq=0, oldest_uncollected_seq=None, version=0)
    return WindowView(**{**base, **kw})


def test_the_three_builtins_are_registered_with_typed_params() -> None:
    reg = get_registries().window_policy
    assert {"no_window", "window_gated", "windowed_fifo"} <= set(reg.names())
    assert {p["name"] for p in reg.entry("windowed_fifo").param_schema()} == {"skew"}
    assert {p["name"] for p in reg.entry("window_gated").param_schema()} == {"window"}
    assert isinstance(window_policy("no_window"), NoWindow)
    fifo = window_policy({"name": "windowed_fifo", "skew": 2})
    assert isinstance(fifo, WindowedFifo) and fifo.params.skew == 2


def test_bad_policy_config_names_the_key() -> None:
    with pytest.raises(UnknownPluginError, match=r"async.window_policy: unknown window_policy.*windowed_fifo"):
        window_policy("windowed_fif")
    with pytest.raises(ConfigError, match=r"async.window_policy"):
        window_policy({"name": "windowed_fifo", "skew": "many"})
    with pytest.raises(ConfigError, match=r"takes no parameters|async.window_policy"):
        window_policy({"name": "no_window", "skew": 2})


def test_no_window_dispatches_the_free_capacity() -> None:
    assert NoWindow().dispatch_count(view(in_flight=3, buffered=2, training=1)) == 2
    assert NoWindow().dispatch_count(view(in_flight=6, buffered=3)) == 0


def test_window_gated_stalls_dispatch_behind_a_straggler() -> None:
    gated = window_policy("window_gated")
    # capacity 8, oldest uncollected 10: seqs up to 17 may start, so 2 more from 16
    assert gated.dispatch_count(view(in_flight=3, next_seq=16, oldest_uncollected_seq=10)) == 2
    assert gated.dispatch_count(view(in_flight=3, next_seq=18, oldest_uncollected_seq=10)) == 0
    narrow = window_policy({"name": "window_gated", "window": 4})
    assert narrow.dispatch_count(view(in_flight=1, next_seq=12, oldest_uncollected_seq=10)) == 2


def test_windowed_fifo_collects_within_one_batch_of_the_oldest() -> None:
    fifo = window_policy("windowed_fifo")
    assert fifo.may_collect(13, view(oldest_uncollected_seq=10))
    assert not fifo.may_collect(14, view(oldest_uncollected_seq=10))
    assert window_policy({"name": "windowed_fifo", "skew": 1}).may_collect(10, view(oldest_uncollected_seq=10))
    assert not window_policy({"name": "windowed_fifo", "skew": 1}).may_collect(11, view(oldest_uncollected_seq=10))


class Greedy(WindowPolicy):
    """Asks for far more than the capacity and refuses every collection."""

    def dispatch_count(self, view: WindowView) -> int:
        return 1000

    def may_collect(self, seq: int, view: WindowView) -> bool:
        return False


def test_the_pipeline_caps_a_greedy_policy_and_keeps_the_oldest_collectable() -> None:
    pipe = Pipeline(Greedy(), batch_size=2, stale_steps=1)
    source = make_source(2, {"a": 1.0})
    assert pipe.dispatch_budget() == 4
    tickets = [pipe.dispatch(source.next_prompt()) for _ in range(4)]
    assert pipe.dispatch_budget() == 0
    with pytest.raises(RuntimeError, match="capacity"):
        pipe.dispatch(source.next_prompt())
    for t in reversed(tickets):  # finish newest first
        sim = start_group(t.prompt, t.seq, t.version, 1)
        sim.advance(10_000)
        pipe.complete(t.seq, sim.result())
        # the policy refuses everything; liveness admits the oldest, then the next oldest...
        assert pipe.collect() == ([0, 1, 2, 3] if t.seq == 0 else [])


class EvenOnly(WindowPolicy):
    """A user's policy from their own package: only even seqs skip the queue."""

    def may_collect(self, seq: int, view: WindowView) -> bool:
        return seq % 2 == 0


class UserPlugin:
    @staticmethod
    @hookimpl
    def loongsage_register_window_policies(register):
        register("even_first", EvenOnly)


@pytest.mark.calls_hook("loongsage_register_window_policies")
def test_a_custom_policy_registers_from_a_plugin_and_gates_collection() -> None:
    registries = load_plugins(extra=[(UserPlugin, "user_window_plugin")])
    policy = window_policy("even_first", registries)
    assert isinstance(policy, EvenOnly)
    assert registries.window_policy.entry("even_first").distribution == "user_window_plugin"
    pipe = Pipeline(policy, batch_size=2, stale_steps=1)
    source = make_source(2, {"a": 1.0})
    tickets = [pipe.dispatch(source.next_prompt()) for _ in range(4)]
    for t in tickets[1:]:
        sim = start_group(t.prompt, t.seq, t.version, 1)
        sim.advance(10_000)
        pipe.complete(t.seq, sim.result())
    assert pipe.collect() == [2]


def test_a_policy_that_is_not_a_window_policy_is_rejected() -> None:
    class NotAPolicy:
        def __init__(self, params):
            pass

    class Plugin:
        @staticmethod
        @hookimpl
        def loongsage_register_window_policies(register):
            register("not_a_policy", NotAPolicy)

    registries = load_plugins(extra=[(Plugin, "bad_window_plugin")])
    with pytest.raises(TypeError, match="subclass of loongsage.runtime.window.WindowPolicy"):
        window_policy("not_a_policy", registries)


def test_gated_is_stricter_than_no_window_and_fifo_only_changes_collection() -> None:
    v = view(in_flight=2, next_seq=20, oldest_uncollected_seq=13)
    assert WindowGated().dispatch_count(v) == 1 < NoWindow().dispatch_count(v) == 6
    assert WindowedFifo().dispatch_count(v) == NoWindow().dispatch_count(v)


def test_the_policy_written_in_the_docs_works() -> None:
    """The `HalfBuffer` example in docs/async.md, executed as written."""
    import re
    import sys
    import types
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "async.md").read_text()
    code = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "class HalfBuffer" in b)
    module = types.ModuleType("docs_half_buffer")
    sys.modules[module.__name__] = module  # dataclasses resolve their module while defined
    exec(compile(code, "docs/async.md", "exec"), module.__dict__)

    class Plugin:
        @staticmethod
        @hookimpl
        def loongsage_register_window_policies(register):
            register("half_buffer", module.HalfBuffer, params=module.HalfBufferParams)

    registries = load_plugins(extra=[(Plugin, "docs_window_plugin")])
    policy = window_policy({"name": "half_buffer", "max_buffered": 3}, registries)
    assert policy.dispatch_count(view(buffered=3)) == 5
    assert policy.dispatch_count(view(buffered=4)) == 0
    assert window_policy("half_buffer", registries).dispatch_count(view(buffered=3)) == 0  # B // 2 = 2
