"""DeadlinePool with real worker processes: a call past its deadline is killed (its process
leaves the process table) and its worker replaced; what a call raises, or a worker that dies,
comes back as ``CallFailed``; workers import what this process can import."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import threading

import pytest

import deadline_probes
from loongsage.deadline.pool import CallFailed, DeadlinePool, default_workers
from loongsage_agents.rewards.math import math_reward
from loongsage_agents.rewards.params import MathRewardParams

pytestmark = [pytest.mark.timeout(180), pytest.mark.serial]  # a call that is not stopped fails the test instead of hanging


async def outcome(pool, timeout_s, fn, *args):
    try:
        return await pool.call(timeout_s, fn, *args)
    except CallFailed as failure:
        return failure


def test_a_spinning_call_is_killed_at_its_deadline_and_its_worker_replaced(tmp_path, process_table):
    params = deadline_probes.ProbeParams(pid_dir=str(tmp_path))
    with DeadlinePool(2) as pool:
        async def go():
            return await asyncio.gather(outcome(pool, 1.0, deadline_probes.probe_reward, "SPIN", None, params),
                                        outcome(pool, 1.0, deadline_probes.probe_reward, "fine", None, params))

        spun, fine = asyncio.run(go())
        after = [asyncio.run(pool.call(5.0, deadline_probes.probe_reward, "fine", None, params)) for _ in range(4)]
        (spin_pid,) = [int(p.name) for p in tmp_path.iterdir()]
        assert isinstance(spun, CallFailed) and spun.timed_out
        assert spun.reason == "timeout after 1 s (worker killed)"
        assert fine == {"score": 1.0, "pid": fine["pid"]} and fine["pid"] != spin_pid
        assert process_table.wait_gone([spin_pid]) == []  # killed, not left spinning
        workers = {r["pid"] for r in after} | {fine["pid"]}
        assert spin_pid not in workers and all(process_table.alive(p) for p in workers)
    assert process_table.wait_gone(workers) == []  # close() leaves no worker behind


def test_what_a_call_raises_or_a_dying_worker_comes_back_as_call_failed(process_table):
    params = deadline_probes.ProbeParams()
    with DeadlinePool(1) as pool:
        raised = asyncio.run(outcome(pool, 5.0, deadline_probes.probe_reward, "RAISE", None, params))
        died = asyncio.run(outcome(pool, 5.0, deadline_probes.probe_reward, "EXIT", None, params))
        unpicklable = asyncio.run(outcome(pool, 5.0, deadline_probes.probe_reward, threading.Lock(), None, params))
        still = asyncio.run(pool.call(5.0, deadline_probes.probe_reward, "fine", None, params))
    assert not raised.timed_out and raised.reason == "ValueError: probe reward rejects 'RAISE'"
    assert "in probe_reward" in raised.traceback_text and raised.traceback_text.rstrip().endswith(raised.reason)
    assert died.reason == "the worker process died (exit code 7)" and not died.timed_out
    assert unpicklable.reason == "cannot send the call to a worker process (TypeError: cannot pickle '_thread.lock' object)"
    assert still["score"] == 1.0 and process_table.wait_gone([still["pid"]]) == []


def test_workers_import_a_module_placed_on_sys_path_after_the_fork_server_started(tmp_path, monkeypatch):
    """A config-local plugin module is importable in the workers however late it was put on
    ``sys.path`` (the fork server keeps the ``sys.path`` it started with)."""
    with DeadlinePool(1) as first:
        asyncio.run(first.call(30.0, os.getpid))  # the fork server now runs with today's sys.path
    (tmp_path / "late_reward_module.py").write_text(textwrap.dedent('''
        def late_reward(text, ground_truth, params, **context):
            return {"score": float(len(text)), "module": __name__}
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("late_reward_module", None)
    import late_reward_module

    with DeadlinePool(1) as pool:
        result = asyncio.run(pool.call(30.0, late_reward_module.late_reward, "abc", None, None))
    assert result == {"score": 3.0, "module": "late_reward_module"}


def test_math_verify_timeouts_work_in_a_worker_main_thread():
    """With the guards off, ``99999999!`` keeps sympy busy for minutes; math-verify's own
    1 s SIGALRM limits end it inside the worker, well before the call's 120 s deadline."""
    params = MathRewardParams(timeout_seconds=1, max_factorial=0)
    with DeadlinePool(1, preload=["loongsage_agents.rewards.math"]) as pool:
        result = asyncio.run(pool.call(120.0, math_reward, "\\boxed{99999999!}", "3", params))
    assert result == {"score": 0.0, "correct": False, "boxed": True}


def test_worker_count_defaults_to_the_cores_this_process_may_use():
    assert DeadlinePool(0).workers == default_workers() == len(os.sched_getaffinity(0))


CONTROLLER = '''
import asyncio, sys
sys.path.insert(0, {probes!r})
import deadline_probes
from loongsage.deadline.pool import DeadlinePool

if __name__ == "__main__":
    pool = DeadlinePool(1)
    asyncio.run(pool.call(600.0, deadline_probes.probe_reward, "SPIN", None,
                          deadline_probes.ProbeParams(pid_dir={pid_dir!r})))
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
def test_a_worker_stuck_in_a_call_dies_with_a_killed_controller(tmp_path, process_table):
    import signal
    import subprocess
    import time
    from pathlib import Path

    script = tmp_path / "controller.py"
    script.write_text(CONTROLLER.format(probes=str(Path(__file__).parent), pid_dir=str(tmp_path)))
    controller = subprocess.Popen([sys.executable, str(script)])
    try:
        deadline = time.monotonic() + 60
        while not [p for p in tmp_path.iterdir() if p.name.isdigit()] and time.monotonic() < deadline:
            time.sleep(0.1)
        (spinner,) = [int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()]
        assert process_table.alive(spinner)
    finally:
        controller.send_signal(signal.SIGKILL)  # no cleanup runs in the controller
        controller.wait()
    assert process_table.wait_gone([spinner]) == []


UNGUARDED = '''
import asyncio, pathlib
from loongsage.deadline.pool import DeadlinePool

with open(pathlib.Path(__file__).with_name("imports.txt"), "a") as marks:
    marks.write(__name__ + "\\n")


def double(x):
    return 2 * x


async def doubled(pool):
    return await asyncio.wait_for(asyncio.gather(*(pool.call(60.0, double, i) for i in range(4))), 120)


with DeadlinePool(2) as pool:
    print("results", asyncio.run(doubled(pool)))
'''


def test_workers_never_import_a_script_without_the_main_guard(tmp_path):
    """A plain script that builds a pool at module level: its workers do not re-run it (a
    ``forkserver`` child imports its parent's main module; each would have built a pool of its own)."""
    import subprocess

    (tmp_path / "unguarded.py").write_text(UNGUARDED)
    done = subprocess.run([sys.executable, "unguarded.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "results [0, 2, 4, 6]" in done.stdout
    assert (tmp_path / "imports.txt").read_text().splitlines() == ["__main__"]
