"""Disaggregated placement pins the trainer and each rollout engine to cores of their own.

``split_cores`` is checked on its own; ``pin_process`` in a real child process, on every
thread it had before the call and on a thread it starts afterwards (Linux only).
"""

from __future__ import annotations

import multiprocessing
import os
import threading

import pytest

from loongsage.controller.actors import pin_process
from loongsage.controller.placement import split_cores


def test_split_cores_gives_disjoint_sets_and_wraps_only_when_short() -> None:
    assert split_cores({0, 1}, [1.0, 1.0]) == [[0], [1]]
    assert split_cores([3, 2, 1, 0], [2.0, 1.0, 1.0]) == [[0, 1], [2], [3]]
    assert split_cores([0, 1, 2, 3], [0.5, 1.5]) == [[0], [1, 2]]
    assert split_cores([0, 1], [1.0, 1.0, 1.0]) == [[0], [1], [0]]
    assert split_cores(range(4), [0.5, 0.5, 1.0, 1.0]) == [[0], [1], [2], [3]]  # 2 ranks, 2 engines
    with pytest.raises(ValueError, match="no CPU cores"):
        split_cores([], [1.0])


def _child(cpu: int, out) -> None:
    before = threading.Thread(target=threading.Event().wait, args=(5,), daemon=True)
    before.start()
    threads = os.listdir("/proc/self/task")  # the threads pin_process sees
    pin_process([cpu])
    seen = {}
    after = threading.Thread(target=lambda: seen.setdefault("after", os.sched_getaffinity(0)))
    after.start()
    after.join()
    # threads that library fork handlers (grpc's, once Ray ran in the parent) may start on their
    # own while this runs are not the ones pinned here: check those that existed and the new one
    masks = [os.sched_getaffinity(int(tid)) for tid in threads if os.path.exists(f"/proc/self/task/{tid}")]
    out.put((masks, seen["after"]))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")
def test_pin_process_pins_existing_and_later_threads() -> None:
    cpu = max(os.sched_getaffinity(0))
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=_child, args=(cpu, out))
    proc.start()
    masks, after = out.get(timeout=60)
    proc.join(timeout=30)
    assert len(masks) >= 2 and all(m == {cpu} for m in masks)
    assert after == {cpu}
