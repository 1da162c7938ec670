"""How a driver's Ray cluster ends at a normal exit (``ray_sessions.end_monitor_first``).

Ray's ``ray.shutdown`` at exit stops the daemons one by one with SIGTERM, each given up to a
second; its autoscaler monitor is stopped after the GCS, and its SIGTERM handler reports to that
GCS, gone by then, so every run waited the full second. The driver now SIGKILLs the monitor of
a cluster it started just before Ray's shutdown, and leaves everything else to Ray. Real
processes throughout: each driver is a Python subprocess with a real local cluster, or attached
to this test process's ``ray_cluster``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from loongsage.controller.memory import process_tree

pytestmark = pytest.mark.timeout(240)

MONITOR = "autoscaler/_private/monitor.py"  # the command line of Ray's autoscaler monitor
GCS = "gcs_server"


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def driver(script: str) -> subprocess.CompletedProcess:
    """``script`` in a fresh Python process (no outside RAY_ADDRESS); fails the test unless it exits 0."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.setdefault("RAY_AUTH_MODE", "disabled")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          env=env, timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


# Ray's exit hook is registered when ray is imported, the probe's after it, start_ray's last:
# at exit they run in the opposite order, so the probe sees what start_ray's hook left to Ray's.
PROBE = """
    import atexit, json, os, sys
    from types import SimpleNamespace
    import ray
    sys.path.insert(0, {tests!r})
    from controller.test_cluster_exit import alive, cmdline
    from loongsage.controller.memory import process_tree

    def daemons():
        return {{pid: cmdline(pid) for pid in process_tree(os.getpid()) if pid != os.getpid()}}

    def probe():
        seen = {{"monitor": [p for p, c in started.items() if {monitor!r} in c],
                 "gcs": [p for p, c in started.items() if {gcs!r} in c]}}
        seen.update({{f"{{k}}_alive": [p for p in v if alive(p)] for k, v in list(seen.items())}})
        print("PROBE " + json.dumps(seen), flush=True)

    atexit.register(probe)
    from loongsage.controller.actors import start_ray
    start_ray(SimpleNamespace(ray_address={address!r}, num_cpus=1, object_store_memory=1 << 27))
    started = daemons()
    assert ray.get(ray.remote(lambda: 7).remote()) == 7
"""


def probed(address: str | None) -> dict:
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = driver(PROBE.format(tests=tests, monitor=MONITOR, gcs=GCS, address=address))
    line = next(line for line in done.stdout.splitlines() if line.startswith("PROBE "))
    return json.loads(line.removeprefix("PROBE "))


def test_a_driver_ends_the_monitor_of_its_own_cluster_before_rays_shutdown_and_nothing_else():
    seen = probed(None)
    assert len(seen["monitor"]) == 1 and len(seen["gcs"]) == 1, seen  # both were started by this driver
    assert seen["monitor_alive"] == [], "the monitor was left to Ray's shutdown, which waits 1 s on it"
    assert seen["gcs_alive"] == seen["gcs"], "the rest of the cluster is Ray's shutdown's to stop"
    assert not any(alive(pid) for pid in seen["monitor"] + seen["gcs"]), "Ray's shutdown stopped the rest"


def test_a_driver_attached_to_a_cluster_it_did_not_start_leaves_its_monitor_alone(ray_cluster):
    ours = [pid for pid in process_tree(os.getpid()) if MONITOR in cmdline(pid)]
    assert len(ours) == 1, "this test process's cluster runs a monitor"
    seen = probed(ray_cluster.get_runtime_context().gcs_address)
    assert seen["monitor"] == [], seen  # the attached driver started no daemon
    assert alive(ours[0]), "the attached driver's exit stopped the monitor of a cluster it did not start"
    assert ray_cluster.get(ray_cluster.remote(lambda: 5).remote()) == 5
