"""Memory readers of ``loongsage.controller.memory`` against real processes.

A child process that writes 200 MB of private memory must show up in its RSS, in the summed
PSS of its parent's process tree, and in a ``PeakSampler``'s peak after it has exited; the
run's RSS-gated reader (``TreePss``) re-reads PSS when the child comes and goes, and not
while nothing changes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from loongsage.controller.memory import (
    PeakSampler, TreePss, machine_memory, process_tree, pss_bytes, rss_bytes, tree_pss_bytes,
)

MB = 1 << 20
CHILD = "import sys, time; block = bytearray(200 << 20); block[::4096] = b'x' * len(block[::4096]); " \
        "print('ready', flush=True); time.sleep(float(sys.argv[1]))"


def start_child(seconds: float) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(seconds)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    return child


def test_child_memory_counts_in_rss_and_in_the_tree_pss():
    own = tree_pss_bytes(os.getpid())
    child = start_child(30)
    try:
        assert child.pid in process_tree(os.getpid())
        assert rss_bytes(child.pid) >= 200 * MB and pss_bytes(child.pid) >= 195 * MB
        assert tree_pss_bytes(os.getpid()) >= own + 195 * MB
    finally:
        child.kill()
        child.wait()
    assert rss_bytes(child.pid) == 0 and pss_bytes(child.pid) == 0  # gone: no error, no figure


def test_peak_sampler_keeps_a_peak_that_is_gone():
    root = os.getpid()
    sampler = PeakSampler(lambda: tree_pss_bytes(root), interval_s=0.05)
    try:
        base = sampler.take()
        child = start_child(0.5)
        child.wait()
        time.sleep(0.1)
        assert tree_pss_bytes(root) < base + 100 * MB  # the child has exited ...
        peak = sampler.take()
        assert peak >= base + 195 * MB  # ... but its memory was seen
        assert sampler.take() < base + 100 * MB and sampler.overall >= peak  # a new window starts
    finally:
        sampler.close()


def test_tree_pss_is_re_read_when_memory_moves_and_not_otherwise():
    reader = TreePss(os.getpid(), slack=64 * MB, max_age_s=3600)
    base = reader()
    assert reader.readings == 1 and abs(base - tree_pss_bytes(os.getpid())) < 64 * MB
    assert reader() == base and reader.readings == 1  # nothing moved: the reading stands
    child = start_child(30)
    try:
        assert reader() >= base + 195 * MB and reader.readings == 2
    finally:
        child.kill()
        child.wait()
    assert reader() < base + 64 * MB and reader.readings == 3  # the drop is seen too
    aged = TreePss(os.getpid(), max_age_s=0.0)
    aged(), aged()
    assert aged.readings == 2  # past max_age_s a call always reads


def test_run_sampler_sees_a_child_peak_through_the_gated_reader():
    sampler = PeakSampler(TreePss(os.getpid(), max_age_s=3600), interval_s=0.05)
    try:
        base = sampler.take()
        child = start_child(0.5)
        child.wait()
        time.sleep(0.2)
        assert sampler.take() >= base + 195 * MB
        assert sampler.take() < base + 100 * MB
    finally:
        sampler.close()


def test_machine_memory_is_sane():
    total, available = machine_memory()
    assert 0 < available <= total
