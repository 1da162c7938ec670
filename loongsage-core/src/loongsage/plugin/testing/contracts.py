"""The contract checks of the kinds that are not algorithms, and one entry point for all kinds.

Each ``check_<kind>_contract(obj, params)`` asserts what core relies on when it calls a
registered object of that kind (``loongsage.plugin.kinds`` has the contract types;
``docs/plugins.md`` §4 the prose), raising ``AssertionError`` when it is broken. The checks
are cheap: no engine, sandbox process or network is started. ``check_entry(entry)`` runs the
check of an entry's kind with its default parameters; ``CONTRACT_CHECKS`` maps every kind
to its check (``tests/plugins/test_contracts.py`` asserts it covers every kind), so a plugin
distribution checks all it registers with::

    for entry in entries_of(installed_registries(), "my-distribution"):
        check_entry(entry)

(an entry whose parameters have required fields is checked with ``check_entry(entry, params)``).
"""

from __future__ import annotations

import dataclasses
import inspect
import tempfile
from typing import Any, Callable, Iterator

from loongsage.plugin.testing.algorithms import (
    check_advantage_contract,
    check_correction_contract,
    check_kl_policy_contract,
    check_policy_loss_contract,
)


def default_params(entry: Any) -> Any:
    """The entry's parameters with their defaults; None when it has no parameter class, a
    field is required (no default, or the ``"???"`` of a mandatory config value) or the
    defaults alone do not validate (a choice between settings the user must make)."""
    if entry.params is None:
        return None
    fields = dataclasses.fields(entry.params)
    if any(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
           for f in fields):
        return None
    try:
        params = entry.params()
    except ValueError:
        return None
    if any(getattr(params, f.name) == "???" for f in fields):
        return None
    return params


def check_data_filter_contract(fn: Callable[..., Any], params: Any) -> None:
    """A filter of no groups keeps no groups and reports float metrics."""
    result = fn([], params)
    assert result.groups == [], f"{fn}: filtering no groups kept {result.groups!r}"
    assert all(isinstance(v, float) for v in result.metrics.values()), "metrics must be floats"


def check_reward_contract(fn: Callable[..., Any], params: Any) -> None:
    """``reward(sample_text, ground_truth, params, **context)`` accepts the context core passes."""
    try:
        inspect.signature(fn).bind("text", "truth", params, prompt=None, sample=None, sandbox=None)
    except TypeError as err:
        raise AssertionError(f"{fn}: reward signature must be (sample_text, ground_truth, params, "
                             f"**context): {err}") from None


def check_dataset_contract(cls: type, params: Any) -> None:
    """``cls(params, seed).get(index) -> Prompt`` with messages, the same for the same seed."""
    from loongsage.data.types import Prompt

    assert callable(getattr(cls, "get", None)), f"{cls} needs get(index)"
    first = cls(params, seed=0).get(0)
    assert isinstance(first, Prompt) and first.messages, f"{cls}.get(0) must be a Prompt with messages"
    assert cls(params, seed=0).get(0) == first, f"{cls}.get must be a pure function of seed and index"


def check_agent_contract(cls: type, params: Any) -> None:
    """``cls(params, context)`` with ``async run_group``."""
    assert inspect.iscoroutinefunction(getattr(cls, "run_group", None)), f"{cls}.run_group must be async"
    try:
        inspect.signature(cls).bind(params, None)
    except TypeError as err:
        raise AssertionError(f"{cls} must be built as cls(params, context): {err}") from None


def check_environment_contract(cls: type, params: Any) -> None:
    """``cls(params, context)`` with ``tasks(split)`` and ``async run_episode(task, endpoint)``."""
    assert callable(getattr(cls, "tasks", None)), f"{cls} needs tasks(split)"
    assert inspect.iscoroutinefunction(getattr(cls, "run_episode", None)), f"{cls}.run_episode must be async"
    try:
        inspect.signature(cls).bind(params, None)
    except TypeError as err:
        raise AssertionError(f"{cls} must be built as cls(params, context): {err}") from None


def check_sandbox_contract(cls: type, params: Any) -> None:
    """An async context manager with ``exec`` and the files API, and a ``pool``."""
    for method in ("exec", "write_file", "read_file", "list_files", "reset", "close", "__aenter__"):
        assert inspect.iscoroutinefunction(getattr(cls, method, None)), f"{cls}.{method} must be async"
    assert callable(getattr(cls, "pool", None)), f"{cls} needs a pool(...) classmethod"


def check_tool_parser_contract(cls: type, params: Any) -> None:
    """Plain text parses to itself with no tool calls; rendered calls parse back to themselves."""
    from loongsage.agentflow.tool_calls import ToolCall

    parser = cls()
    assert isinstance(parser.start_marker, str) and parser.start_marker, "start_marker must be a non-empty str"
    parsed = parser.parse("The answer is 4.")
    assert (parsed.content, parsed.tool_calls) == ("The answer is 4.", []), f"plain text parsed as {parsed!r}"
    calls = [ToolCall.from_args("calculator", {"expression": "345 + 678"}),
             ToolCall.from_args("bash", {"command": "ls -la\necho 'x'", "timeout": 5})]
    parsed = parser.parse(parser.render(calls))
    assert parsed.content == "", f"rendered calls left content {parsed.content!r}"
    assert [(c.name, c.args_object()) for c in parsed.tool_calls] == \
        [(c.name, c.args_object()) for c in calls], "parse(render(calls)) must give the calls back"


def check_router_middleware_contract(cls: type, params: Any) -> None:
    """A subclass of ``RouterMiddleware`` built as ``cls(settings, params)``: the router hands
    it its settings, with its plugins resolved, and nothing to look a plugin up with."""
    from loongsage.agentflow.middleware import RouterMiddleware
    from loongsage.agentflow.settings import RouterSettings

    assert isinstance(cls, type) and issubclass(cls, RouterMiddleware), f"{cls} must subclass RouterMiddleware"
    try:
        middleware = cls(RouterSettings(), params)
    except TypeError as err:
        raise AssertionError(f"{cls}: a router middleware is built as cls(settings, params): {err}") from None
    assert isinstance(middleware, RouterMiddleware), f"{cls}(settings, params) must be a RouterMiddleware"


def check_window_policy_contract(cls: type, params: Any) -> None:
    """A subclass of ``WindowPolicy`` built from its params."""
    from loongsage.runtime.window import WindowPolicy

    assert isinstance(cls(params), WindowPolicy), f"{cls}(params) must be a WindowPolicy"


def check_engine_contract(cls: type, params: Any) -> None:
    """A class built by ``from_config(cfg, device=...)``."""
    assert callable(getattr(cls, "from_config", None)), f"{cls} needs from_config(cfg, device=...)"


def check_tracker_contract(cls: type, params: Any) -> None:
    """A ``Tracker`` built as ``cls(params, run_dir, config)`` that logs a step and closes."""
    from loongsage.tracking.base import Tracker

    with tempfile.TemporaryDirectory() as run_dir:
        tracker = cls(params, run_dir, {})
        assert isinstance(tracker, Tracker), f"{cls} must subclass Tracker"
        tracker.log({"rollout/reward_mean": 0.5}, 0)
        tracker.close()


def check_step_term_contract(obj: Any, params: Any) -> None:
    """A ``section`` name (a root section, or ``parent.name`` inside a core section), dataclass
    ``schema`` (and ``source_schema``, a dataclass or None), optional ``has_train_term`` (a bool)
    and ``supplies`` (a tuple of ``batch.extras`` keys), and ``validate(cfg, registries)``,
    ``memory(cfg, settings, batch_tokens)``, ``build(context)``."""
    section = getattr(obj, "section", None)
    parts = section.split(".") if isinstance(section, str) else []
    assert 1 <= len(parts) <= 2 and all(p.isidentifier() for p in parts), \
        f"{obj} needs a section name (name or parent.name), got {section!r}"
    assert dataclasses.is_dataclass(getattr(obj, "schema", None)), f"{obj} needs a dataclass schema"
    source = getattr(obj, "source_schema", None)
    assert source is None or dataclasses.is_dataclass(source), f"{obj}: source_schema must be a dataclass or None"
    assert isinstance(getattr(obj, "has_train_term", True), bool), f"{obj}: has_train_term must be a bool"
    supplies = getattr(obj, "supplies", ())
    assert isinstance(supplies, tuple) and all(isinstance(k, str) for k in supplies), \
        f"{obj}: supplies must be a tuple of batch.extras keys, got {supplies!r}"
    for method, args in (("validate", (None, None)), ("memory", (None, None, 0)), ("build", (None,))):
        fn = getattr(obj, method, None)
        assert callable(fn), f"{obj} needs {method}"
        try:
            inspect.signature(fn).bind(*args)
        except TypeError as err:
            raise AssertionError(f"{obj}.{method} takes {len(args)} argument(s): {err}") from None


def check_command_contract(fn: Callable[..., Any], params: Any) -> None:
    """``main(argv, registries) -> exit code``."""
    try:
        inspect.signature(fn).bind([], None)
    except TypeError as err:
        raise AssertionError(f"{fn}: a command is main(argv, registries): {err}") from None


def _check_kl_policy(fn: Callable[..., Any], params: Any) -> None:
    check_kl_policy_contract(fn, getattr(params, "kl_targets", "logprobs"))


CONTRACT_CHECKS: dict[str, Callable[[Any, Any], None]] = {
    "agent": check_agent_contract,
    "reward": check_reward_contract,
    "sandbox": check_sandbox_contract,
    "dataset": check_dataset_contract,
    "environment": check_environment_contract,
    "tool_parser": check_tool_parser_contract,
    "router_middleware": check_router_middleware_contract,
    "advantage": check_advantage_contract,
    "policy_loss": check_policy_loss_contract,
    "kl_policy": _check_kl_policy,
    "is_correction": check_correction_contract,
    "data_filter": check_data_filter_contract,
    "window_policy": check_window_policy_contract,
    "engine": check_engine_contract,
    "tracker": check_tracker_contract,
    "step_term": check_step_term_contract,
    "command": check_command_contract,
}


def check_entry(entry: Any, params: Any = None) -> None:
    """Check one registry entry against its kind's contract, with ``params`` (its default
    parameters when None). An entry whose parameters have required fields (a dataset's file)
    needs ``params``: without them a ``TypeError`` says so."""
    if params is None:
        params = default_params(entry)
        if params is None and entry.params is not None:
            raise TypeError(f"{entry.kind} '{entry.name}' has required parameters: "
                            f"check_entry(entry, params={entry.params.__name__}(...))")
    CONTRACT_CHECKS[entry.kind](entry.obj, params)


def entries_of(registries: Any, distribution: str | None = None) -> Iterator[Any]:
    """Every entry of every kind in ``registries`` (only ``distribution``'s, when given)."""
    for registry in registries:
        for entry in registry:
            if distribution is None or entry.distribution == distribution:
                yield entry
