"""Meta-tests: every hook is documented with its exact signature, and every hook is tested."""

from __future__ import annotations

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


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_a_test_outside_the_meta_tests(hook):
    here = Path(__file__).resolve()
    tests = [p for p in REPO.glob("**/tests/**/test_*.py") if ".venv" not in p.parts and p != here]
    tests = [p for p in tests if p.name != "test_every_hook.py"]
    assert any(hook in p.read_text(encoding="utf-8") for p in tests), f"no test mentions {hook}"


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
