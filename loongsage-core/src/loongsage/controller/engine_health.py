"""The engine monitor: find a dead or hung rollout engine, restart it, give it the weights.

A thread of the driver looks at every engine each ``rollout.health.interval_s``: its process
(on a local cluster, ``/proc/<pid>/stat``: gone, a zombie, dying, or stopped by a signal means
dead or hung at once) and its ``/health`` endpoint (``failures`` probes in a row that do not
answer 200 mean hung, which is how a remote or frozen engine shows). The engine pool marks a
replica down by itself the moment a request cannot reach it; the monitor then either finds
the engine healthy (a transient failure: the replica is used again) or restarts it.

A restart kills the old actor (SIGKILL of its process first when it is local and stopped:
a stopped process answers no kill request), starts a new ``EngineHost`` in the very seat,
hence the same placement-group bundle, starts its server, connects it to the run's weight
sync (``WeightSync.replace_engine``), pushes the current weight version to it (under
``Run.weights_lock``, so never the weights of a step half trained), waits for ``/health`` and
only then puts it back in the pool. Requests that were in flight on the dead engine are sent
again by the pool (``EnginePool.agenerate``); each retry and each restart is a line of
``<run_dir>/engine_events.jsonl`` and counted in the step's metrics
(``rollout/engine_retries``, ``rollout/engine_restarts``, ``perf/engine_restart_s``). Past
``max_restarts`` restarts in one run the engine stays down and requests fail with the
pool's error naming it.

Peer: slime's ``--use-fault-tolerance`` (a health checker per engine that kills and
relaunches a failed server and re-syncs weights); slime restarts between rollouts, this
monitor restarts as soon as it sees the failure, while the other engines keep generating.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import ray

from loongsage.controller.actors import spawn_engine
from loongsage.engines.client import EngineClient

log = logging.getLogger(__name__)


PF_EXITING = 0x4  # the task flag the kernel sets as a process starts exiting (include/linux/sched.h)
SIGKILL_PENDING = 1 << (signal.SIGKILL - 1)  # its bit in /proc/<pid>/status's signal masks


def process_state(pid: int) -> str:
    """``running``, ``stopped`` (SIGSTOP / traced) or ``gone`` for a local pid: exited, a zombie,
    or dying. A SIGKILLed process keeps state ``R`` in ``/proc/<pid>/stat`` while the kernel tears
    it down (over 18 ms for a 1 GB one, measured), so a pending SIGKILL or the exiting flag read
    as gone: an engine killed just before its ``/health`` probe is named as killed, not hung."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        state, flags = fields[0], int(fields[6])
        if flags & PF_EXITING or _sigkill_pending(pid):
            return "gone"
    except (OSError, IndexError, ValueError):
        return "gone"
    return {"T": "stopped", "t": "stopped", "Z": "gone", "X": "gone"}.get(state, "running")


def _sigkill_pending(pid: int) -> bool:
    """Whether a SIGKILL waits for ``pid`` (its own or its thread group's pending set)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        return any(line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & SIGKILL_PENDING
                   for line in handle)


class EngineMonitor:
    """Watches ``run.rollout_actors`` behind ``pool``; see the module docstring."""

    def __init__(self, run: Any, pool: Any, engine_cfg: dict, events: Path) -> None:
        self.run, self.pool, self.engine_cfg = run, pool, engine_cfg
        self.settings = run.cfg.rollout.health
        self.local = run.memory.local if run.memory is not None else True
        self.events = events
        self.pids = [ray.get(a.where.remote())["pid"] for a in run.rollout_actors]
        self.misses = [0] * len(pool)
        self.restarts = 0
        self._restarts_since: list[float] = []  # seconds each restart took, since metrics()
        # One look or restart at a time (the monitor thread and ``heal`` both check), and
        # metrics() beside them: a check that ran during a restart would probe the old client
        # of a seat that already holds the new actor and restart it a second time.
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="engine-monitor")

    def start(self) -> "EngineMonitor":
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    # ---- watching ------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(self.settings.interval_s):
            for idx in range(len(self.pool)):
                if self._stop.is_set():
                    return
                try:
                    self.check(idx)
                except Exception as err:  # a failed restart leaves the replica down, named
                    self.pool.mark_down(idx, f"restart failed: {type(err).__name__}: {err}")
                    self._event({"event": "restart_failed", "replica": idx, "error": str(err)})
                    log.error(f"rollout engine {idx}: restart failed ({type(err).__name__}: {err})")

    def check(self, idx: int, misses_allowed: int | None = None) -> bool:
        """Look at replica ``idx`` once; restart it when it is dead or hung. False when it
        is down and stays down (out of restarts)."""
        with self._lock:
            return self._check(idx, misses_allowed)

    def _check(self, idx: int, misses_allowed: int | None) -> bool:
        actor = self.run.rollout_actors[idx]
        state = process_state(self.pids[idx]) if self.local else "running"
        if state == "running" and self.pool.clients[idx].health():
            self.misses[idx] = 0
            self.pool.mark_up(idx)
            return True
        if state == "running" and self.local:  # a process that died during the probe is named as gone
            state = process_state(self.pids[idx])
        self.misses[idx] += 1
        allowed = self.settings.failures if misses_allowed is None else misses_allowed
        if state == "running" and self.misses[idx] < allowed:
            return True
        why = {"gone": "its process is gone", "stopped": "its process is stopped (hung)"}.get(
            state, f"/health did not answer {self.misses[idx]} times in a row")
        self.pool.mark_down(idx, why)
        if self.restarts >= self.settings.max_restarts:
            return False
        self.restart(idx, why, actor)
        return True

    def heal(self, version: int) -> bool:
        """After a weight sync some engine did not apply: restart, now, every engine that
        does not answer (each restart sends it ``version``). True when every engine then
        holds ``version``."""
        if not all([self.check(idx, misses_allowed=1) for idx in range(len(self.pool))]):
            return False
        return all(v == version for v in self.run.weight_sync.versions())

    # ---- restarting ----------------------------------------------------------------------
    def restart(self, idx: int, why: str, seen: Any) -> float:
        """Replace engine ``idx`` (same seat) if it still is the actor ``seen`` down, give
        it the current weights; return the seconds it took (0: restarted meanwhile)."""
        run = self.run
        with self._lock:
            if run.rollout_actors[idx] is not seen:
                return 0.0
            start = time.monotonic()
            log.warning(f"rollout engine {idx} is down ({why}): restarting it in its bundle")
            self._kill(idx)
            seat = run.placement.plan.role("rollout")[idx]
            actor = spawn_engine(run.spec.rollout_engine.obj, self.engine_cfg, seat, run.placement)
            timeout = self.settings.restart_timeout_s
            url = ray.get(actor.call.remote("start"), timeout=timeout)
            self.pids[idx] = ray.get(actor.where.remote(), timeout=timeout)["pid"]
            with run.weights_lock:
                run.rollout_actors[idx] = actor
                version = run.weight_sync.replace_engine(idx, actor, run.version)
            client = EngineClient(url)
            client.wait_until_healthy(timeout)
            if run.memory is not None:
                run.memory.actors[f"rollout{idx}"] = actor
            self.misses[idx] = 0
            self.pool.replace(idx, client)
            seconds = time.monotonic() - start
            self.restarts += 1
            self._restarts_since.append(seconds)
            self._event({"event": "restart", "replica": idx, "reason": why, "seconds": round(seconds, 3),
                         "weight_version": version, "pid": self.pids[idx], "url": url})
            log.warning(f"rollout engine {idx} restarted in {seconds:.1f} s with weight version {version}")
            return seconds

    def _kill(self, idx: int) -> None:
        if self.local and process_state(self.pids[idx]) != "gone":
            try:
                os.kill(self.pids[idx], signal.SIGKILL)  # a stopped process handles no kill request
            except ProcessLookupError:
                pass
        ray.kill(self.run.rollout_actors[idx], no_restart=True)

    # ---- reporting -----------------------------------------------------------------------
    def _event(self, row: dict) -> None:
        with open(self.events, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"time": time.time(), **row}) + "\n")

    def metrics(self) -> dict[str, float]:
        """Retries and restarts since the last call (each retry also written as an event)."""
        retries = self.pool.take_retries()
        for retry in retries:
            self._event({"event": "retry", "rid": retry.rid, "attempt": retry.attempt,
                         "replica": retry.replica, "reason": retry.reason})
        with self._lock:
            restarts, self._restarts_since = self._restarts_since, []
        metrics = {"rollout/engine_retries": float(len(retries)), "rollout/engine_restarts": float(len(restarts))}
        if restarts:
            metrics["perf/engine_restart_s"] = max(restarts)
        return metrics
