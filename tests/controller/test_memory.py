"""Memory and CPU-time readers of ``loongsage.controller.memory`` against real processes.

A child process that writes 200 MB of private memory must show up in its RSS, in the summed
PSS of its parent's process tree, and in a ``PeakSampler``'s peak after it has exited; the
run's RSS-gated reader (``TreePss``) re-reads PSS when the child comes and goes, and not
while nothing changes. CPU burnt by a process that has already exited (a sandbox's test run)
still counts in its tree, through the parent that reaped it.

The memory tests measure the tree of a quiet process of their own (``QuietTree``), not the
pytest worker's: that one also holds the session's Ray (``ray_cluster``) and the actors of
earlier tests, whose memory moves by more than the tests' margins while they run (a full run
read a peak only 194 MB above a base of 2,699 MB taken from that tree: something else in it
had shrunk meanwhile).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from loongsage.controller.memory import (
    PeakSampler, RunMemory, TreePss, cpu_seconds, machine_memory, process_tree, pss_bytes, rss_bytes,
    tree_cpu_seconds, tree_pss_bytes,
)

MB = 1 << 20
CHILD = "import sys, time; block = bytearray(200 << 20); block[::4096] = b'x' * len(block[::4096]); " \
        "print('ready', flush=True); time.sleep(float(sys.argv[1]))"
ROOT = (f"import subprocess, sys\n"
        f"for seconds in sys.stdin:\n"
        f"    child = subprocess.Popen([sys.executable, '-c', {CHILD!r}, seconds.strip()],"
        f" stdout=subprocess.PIPE, text=True)\n"
        f"    print(child.stdout.readline().strip(), child.pid, flush=True)\n"
        f"    child.wait()\n"
        f"    print('exited', flush=True)\n")


class QuietTree:
    """A process whose tree holds nothing but the 200 MB child it is asked for, one at a time."""

    def __init__(self) -> None:
        self._root = subprocess.Popen([sys.executable, "-c", ROOT], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.pid = self._root.pid

    def start_child(self, seconds: float) -> int:
        """The child's pid once its 200 MB are written; it lives ``seconds``."""
        self._root.stdin.write(f"{seconds}\n")
        self._root.stdin.flush()
        word, pid = self._root.stdout.readline().split()
        assert word == "ready"
        return int(pid)

    def reaped(self) -> None:
        """Returns once the root has reaped its child."""
        assert self._root.stdout.readline().strip() == "exited"

    def kill_child(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        self.reaped()

    def close(self) -> None:
        """Kills the root and a child a failed test left alive (one process group)."""
        os.killpg(self.pid, signal.SIGKILL)
        self._root.wait()


@pytest.fixture
def tree():
    quiet = QuietTree()
    yield quiet
    quiet.close()


def test_child_memory_counts_in_rss_and_in_the_tree_pss(tree):
    own = tree_pss_bytes(tree.pid)
    child = tree.start_child(30)
    try:
        assert child in process_tree(tree.pid)
        assert rss_bytes(child) >= 200 * MB and pss_bytes(child) >= 195 * MB
        assert tree_pss_bytes(tree.pid) >= own + 195 * MB
    finally:
        tree.kill_child(child)
    assert rss_bytes(child) == 0 and pss_bytes(child) == 0  # gone: no error, no figure


def test_peak_sampler_keeps_a_peak_that_is_gone(tree):
    sampler = PeakSampler(lambda: tree_pss_bytes(tree.pid), interval_s=0.05)
    try:
        base = sampler.take()
        tree.start_child(0.5)
        tree.reaped()
        assert tree_pss_bytes(tree.pid) < base + 100 * MB  # the child has exited ...
        peak = sampler.take()
        assert peak >= base + 195 * MB  # ... but its memory was seen
        assert sampler.take() < base + 100 * MB and sampler.overall >= peak  # a new window starts
    finally:
        sampler.close()


def test_tree_pss_is_re_read_when_memory_moves_and_not_otherwise(tree):
    reader = TreePss(tree.pid, slack=64 * MB, max_age_s=3600)
    base = reader()
    assert reader.readings == 1 and abs(base - tree_pss_bytes(tree.pid)) < 64 * MB
    assert reader() == base and reader.readings == 1  # nothing moved: the reading stands
    child = tree.start_child(30)
    try:
        assert reader() >= base + 195 * MB and reader.readings == 2
    finally:
        tree.kill_child(child)
    assert reader() < base + 64 * MB and reader.readings == 3  # the drop is seen too
    aged = TreePss(tree.pid, max_age_s=0.0)
    aged(), aged()
    assert aged.readings == 2  # past max_age_s a call always reads


def test_run_sampler_sees_a_child_peak_through_the_gated_reader(tree):
    """Within the reader's documented error: a reading taken while the child was still
    touching its pages stands until the tree's RSS moves by ``slack`` again (seen under load)."""
    reader = TreePss(tree.pid, slack=16 * MB, max_age_s=3600)
    sampler = PeakSampler(reader, interval_s=0.05)
    try:
        base = sampler.take()
        tree.start_child(0.5)
        tree.reaped()
        time.sleep(0.2)
        assert sampler.take() >= base + 195 * MB - reader.slack
        assert sampler.take() < base + 100 * MB
    finally:
        sampler.close()


TICK = 1.1 / os.sysconf("SC_CLK_TCK")  # /proc's CPU times are in ticks; differences of sums round
BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5:\n    pass"
REAPER = (f"import subprocess, sys, time; subprocess.run([sys.executable, '-c', {BURN!r}]); "
          "print('ready', flush=True); time.sleep(30)")


def test_cpu_of_an_exited_process_counts_in_its_tree_through_its_reaper():
    """A child reaps a grandchild that burnt 0.5 s of CPU and lives on: the burn is in the
    child's reaped time and in our tree's; once we reap the child, in ours."""
    root = os.getpid()
    before = tree_cpu_seconds(root)
    child = subprocess.Popen([sys.executable, "-c", REAPER], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        own, with_reaped = cpu_seconds(child.pid), cpu_seconds(child.pid, reaped=True)
        assert with_reaped - own >= 0.45  # the grandchild's burn, not the child's own start-up
        assert tree_cpu_seconds(root) - before >= with_reaped - TICK
    finally:
        child.kill()
        child.wait()
    assert cpu_seconds(child.pid) == 0.0  # gone: no error, no figure
    assert tree_cpu_seconds(root) - before >= with_reaped - TICK  # now in our reaped time


def test_run_memory_reports_the_cpu_seconds_of_each_step():
    """``perf/run_cpu_s`` is the tree's CPU since the previous step's figures, a child's
    included: a step in which a child burns 0.5 s reports at least that, a quiet one little."""
    memory = RunMemory({}, local=True)
    try:
        memory.step_metrics()
        child = subprocess.Popen([sys.executable, "-c", BURN])
        child.wait()
        busy = memory.step_metrics()["perf/run_cpu_s"]
        time.sleep(0.3)
        quiet = memory.step_metrics()["perf/run_cpu_s"]
    finally:
        memory.close()
    assert busy >= 0.5 and busy - quiet >= 0.4


def test_machine_memory_is_sane():
    total, available = machine_memory()
    assert 0 < available <= total
