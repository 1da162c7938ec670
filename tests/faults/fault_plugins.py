"""Fault-injection plugins for ``tests/faults``: loaded by the CLI under test as a config-local
plugin module (``plugins=[fault_plugins]``, this folder on ``PYTHONPATH``), registered through
the same hooks as any third-party code, so nothing test-only lives in the product.

* ``sync_stopping_rollout``: the embedded rollout engine, except that the first time any engine
  of the run is handed weight version ``SYNC_STOP_VERSION``, to copy or to bind (every bucket
  has arrived through TransferMesh, the trainer waits in ``TransferMesh.sync`` for this
  engine's result) it writes its pid to ``<run_dir>/faults/sync`` and stops there until the
  test kills it.
* ``abort_stopping_rollout``: the embedded rollout engine, except that the first abort-all of a
  weight update that finds requests running or queued in it (``EnginePool.abort_for_update``
  with the pool holding new requests) writes its pid to ``<run_dir>/faults/abort`` and stops
  before aborting anything, until the test kills it: the kill lands while requests are both
  held (in the pool) and in flight (at the engine).
* ``always_bash``: a tool parser that reads every model reply as one call of the ``bash`` tool
  running ``BASH_COMMAND`` (the random tiny model never writes a well-formed call), so each
  turn of a ``tool_loop`` trajectory runs a command in its sandbox that lasts long enough for
  the test to kill the sandbox's supervisor mid-exec.

A stop is claimed once per run (an exclusively created file), so the engine the monitor starts
in the killed one's place runs normally. A stop gives up after ``HOLD_S`` seconds, so a test
that never kills cannot hang the run.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from loongsage import hookimpl
from loongsage.agentflow.tool_calls import ParsedOutput, ToolCall
from loongsage.engines.embedded_rollout.engine import EmbeddedRolloutEngine

SYNC_STOP_VERSION = 3  # with a warm start: version 1 is its weights, 2 after step 0, 3 after step 1
HOLD_S = 120.0
BASH_COMMAND = "sleep 1; echo tool-ran"


def claim(run_dir: str, name: str) -> bool:
    """True for the first caller of the run only; it writes its pid to ``<run_dir>/faults/<name>``."""
    folder = Path(run_dir) / "faults"
    folder.mkdir(exist_ok=True)
    try:
        fd = os.open(folder / f"{name}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    (folder / f"{name}.tmp").write_text(str(os.getpid()))
    os.replace(folder / f"{name}.tmp", folder / name)  # the test never reads a half-written pid
    return True


class _Stopping(EmbeddedRolloutEngine):
    run_dir = ""

    @classmethod
    def from_config(cls, cfg, device=None):
        engine = super().from_config(cfg, device=device)
        engine.run_dir = str(cfg["trainer"]["run_dir"])
        return engine


class SyncStoppingRollout(_Stopping):
    """Stops inside the weight sync of ``SYNC_STOP_VERSION`` (see the module docstring)."""

    def apply_weights(self, named_tensors, version=None):
        if version == SYNC_STOP_VERSION and claim(self.run_dir, "sync"):
            time.sleep(HOLD_S)
        return super().apply_weights(named_tensors, version)

    def bind_weights(self, named_views, version=None):  # colocated: views from version 2 on
        if version == SYNC_STOP_VERSION and claim(self.run_dir, "sync"):
            time.sleep(HOLD_S)
        return super().bind_weights(named_views, version)


class AbortStoppingRollout(_Stopping):
    """Stops in the first abort-all that finds requests in the engine (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        abort = self.scheduler.abort

        def stopping(rid):
            load = self.scheduler.load()
            if rid is None and load["running"] + load["waiting"] > 0 and claim(self.run_dir, "abort"):
                time.sleep(HOLD_S)
            return abort(rid)

        self.scheduler.abort = stopping


class AlwaysBash:
    """Every reply is one ``bash`` call of ``BASH_COMMAND`` (module docstring)."""

    start_marker = "<tool_call>"

    def parse(self, text: str) -> ParsedOutput:
        return ParsedOutput(content="", tool_calls=[ToolCall.from_args("bash", {"command": BASH_COMMAND})])

    def render(self, calls) -> str:
        return "\n".join(f"<tool_call>\n{json.dumps({'name': c.name, 'arguments': c.args_object()})}\n</tool_call>"
                         for c in calls)


@hookimpl
def loongsage_register_engines(register):
    register("sync_stopping_rollout", SyncStoppingRollout)
    register("abort_stopping_rollout", AbortStoppingRollout)


@hookimpl
def loongsage_register_tool_parsers(register):
    register("always_bash", AlwaysBash)
