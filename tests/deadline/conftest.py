"""Fixtures of the deadline tests: the probe plugins' registries and the process table.

``deadline_probes`` sits in this folder, put on ``sys.path`` here, because reward worker
processes import a reward by its module name, as they import a config-local plugin module.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def registries():
    import deadline_probes

    from loongsage.plugins import load_plugins

    return load_plugins(extra=[(deadline_probes, "deadline-probes")])


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone: it runs nothing)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids, timeout: float = 15.0) -> list[int]:
    """The pids still alive after waiting up to ``timeout`` seconds for them to exit."""
    deadline = time.monotonic() + timeout
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if alive(p)]
    return left


@pytest.fixture
def process_table():
    """``alive(pid)`` and ``wait_gone(pids)`` over the real process table."""
    return type("ProcessTable", (), {"alive": staticmethod(alive), "wait_gone": staticmethod(wait_gone)})
