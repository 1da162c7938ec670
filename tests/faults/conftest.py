"""Fault-injection tests reuse the end-to-end helpers (``runs``: the real CLI in a subprocess
with its own Ray cluster) from ``tests/e2e/conftest.py``; ``fault_plugins.py`` beside this file
is the config-local plugin module a run loads (``plugins=[fault_plugins]``) to stop at a chosen
point: every watched run has this folder on its ``PYTHONPATH``."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("e2e_helpers", Path(__file__).parent.parent / "e2e" / "conftest.py")
e2e_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(e2e_helpers)
runs = e2e_helpers.runs


MARKER = "LOONGSAGE_TEST_RUN"  # in a watched run's environment, so in every process it starts
_marks: dict[int, str] = {}  # a watched run's pid (its session) -> its marker


def _run_processes(sid: int) -> list[int]:
    """Live pids of the run started in session ``sid``: those of that session, and those carrying
    the run's marker (Ray's daemons and their workers run in sessions of their own)."""
    needle = f"{MARKER}={_marks.get(sid)}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/environ", "rb") as handle:
                marked = sid in _marks and needle in handle.read().split(b"\0")
        except OSError:
            continue
        if (int(fields[3]) == sid or marked) and fields[0] not in "ZX":
            pids.append(int(entry))
    return pids


@pytest.fixture
def leftovers():
    """``leftovers(sid)``: the processes of the run in session ``sid`` still alive after up to 60 s."""

    def wait(sid: int, timeout: float = 60.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while _run_processes(sid) and time.monotonic() < deadline:
            time.sleep(0.5)
        return _run_processes(sid)

    return wait


class WatchedRun:
    """``loongsage train`` (a tiny recipe, ``tiny/grpo`` unless ``config`` names another) in its
    own session, its output collected as it comes; ``env`` adds variables. This folder is first
    on its ``PYTHONPATH``, so the CLI and its Ray workers can import ``fault_plugins``."""

    def __init__(self, runs, run_dir, *overrides: str, config: str = "tiny/grpo",
                 env: dict[str, str] | None = None) -> None:
        args = [*runs.cli, "train", "--config-name", config, f"trainer.run_dir={run_dir}",
                "logging.progress_bar=false", *overrides]
        mark = uuid.uuid4().hex
        environ = {**runs.env(), **(env or {}), MARKER: mark}
        environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                              environ.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(args, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        _marks[self.proc.pid] = mark
        self.out: list[str] = []
        threading.Thread(target=lambda: self.out.extend(self.proc.stdout), daemon=True).start()

    @property
    def text(self) -> str:
        return "".join(self.out)

    def actor_pids(self) -> dict[str, int]:
        """Role -> pid, from the run's ``actor processes:`` line."""
        line = next(line for line in self.out if "actor processes:" in line)
        return {role: int(pid) for role, pid in re.findall(r"(\w+) (\d+)", line.split("actor processes:")[1])}


@pytest.fixture
def watched(runs):
    """``watched(run_dir, *overrides, config=, env=)`` starts a ``WatchedRun``; its whole session
    is killed after the test."""
    started: list[WatchedRun] = []

    def start(run_dir, *overrides: str, **options) -> WatchedRun:
        started.append(WatchedRun(runs, run_dir, *overrides, **options))
        return started[-1]

    yield start
    for run in started:
        if run.proc.poll() is None:
            runs.kill_group(run.proc)
        print(run.text[-6000:])  # shown by pytest when the test failed
