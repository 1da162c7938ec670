"""Meta-tests: every hook is documented with its exact signature, and has a test that calls it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from loongsage import hookimpl, hookspecs
from loongsage.plugins import load_plugins
from loongsage.registry import KINDS

REPO = Path(__file__).resolve().parents[2]
HOOKS = sorted(
    name for name, fn in vars(hookspecs).items() if name.startswith("loongsage_register_") and callable(fn)
)


def test_hooks_match_the_kinds():
    assert HOOKS == sorted(k.hook for k in KINDS.values())


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_documented_with_its_exact_signature(hook):
    signature = f"{hook}{inspect.signature(getattr(hookspecs, hook))}"
    assert f"`{signature}`" in (REPO / "docs" / "plugins.md").read_text(encoding="utf-8")


def marked_tests() -> dict[str, list[str]]:
    """hook -> the test functions marked ``@pytest.mark.calls_hook(hook, ...)``, read from source.

    The mark is enforced where the test runs (``tests/conftest.py``): the test fails unless
    library code used a plugin it registered through every hook it names.
    """
    found: dict[str, list[str]] = {}
    for path in sorted((REPO / "tests").glob("**/test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.name.startswith("test"):
                continue
            for mark in node.decorator_list:
                if isinstance(mark, ast.Call) and ast.unparse(mark.func) == "pytest.mark.calls_hook":
                    for arg in mark.args:
                        found.setdefault(ast.literal_eval(arg), []).append(f"{path.relative_to(REPO)}::{node.name}")
    return found


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_a_test_that_calls_it(hook):
    assert marked_tests().get(hook), (
        f"no test is marked @pytest.mark.calls_hook({hook!r}): add one that registers a plugin "
        "through the hook and runs the library code that uses it")


def test_the_mark_counts_library_use_only(hook_usage):
    """A plugin the test fetches itself is not counted; the library resolving it is."""
    from loongsage.runtime.scheduler import build_window_policy
    from loongsage.runtime.window import NoWindow

    class Plugin:
        @staticmethod
        @hookimpl
        def loongsage_register_window_policies(register):
            register("meta_window", NoWindow)

    registries = load_plugins(extra=[(Plugin, "meta_window_plugin")])
    with hook_usage.recording() as used:
        registries.window_policy.get("meta_window")
        registries.window_policy.get("no_window")
    assert used == set()
    shipped = registries.resolve("window_policy", "no_window", "async.window_policy")
    ours = registries.resolve("window_policy", "meta_window", "async.window_policy")
    with hook_usage.recording() as used:
        build_window_policy(shipped)  # a shipped plugin does not count either
    assert used == set()
    with hook_usage.recording() as used:
        build_window_policy(ours)
    assert used == {"window_policy"}


def test_every_hook_registers_through_a_runtime_plugin():
    """One implementation per hook: each lands in its own registry under this plugin's name."""

    class EveryHook:
        pass

    def make(kind):
        @hookimpl(specname=KINDS[kind].hook)
        def impl(register):
            register(f"meta_{kind}", object(), doc=f"meta {kind}")

        return impl

    for kind in KINDS:
        setattr(EveryHook, f"impl_{kind}", staticmethod(make(kind)))
    registries = load_plugins(extra=[(EveryHook, "meta_plugin")])
    for kind in KINDS:
        entry = registries[kind].entry(f"meta_{kind}")
        assert (entry.distribution, entry.doc) == ("meta_plugin", f"meta {kind}")
