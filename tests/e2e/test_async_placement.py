"""Disaggregated placement pins the trainer and each rollout engine to cores of their own.

``split_cores`` is checked on its own; ``pin_process`` in a real child process (a fresh
interpreter), on every thread it had before the call and on a thread it starts afterwards
(Linux only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from loongsage.controller.placement import split_cores


def test_split_cores_gives_disjoint_sets_and_wraps_only_when_short() -> None:
    assert split_cores({0, 1}, [1.0, 1.0]) == [[0], [1]]
    assert split_cores([3, 2, 1, 0], [2.0, 1.0, 1.0]) == [[0, 1], [2], [3]]
    assert split_cores([0, 1, 2, 3], [0.5, 1.5]) == [[0], [1, 2]]
    assert split_cores([0, 1], [1.0, 1.0, 1.0]) == [[0], [1], [0]]
    assert split_cores(range(4), [0.5, 0.5, 1.0, 1.0]) == [[0], [1], [2], [3]]  # 2 ranks, 2 engines
    with pytest.raises(ValueError, match="no CPU cores"):
        split_cores([], [1.0])


# Run in a fresh interpreter: a child forked from this test process (threads of earlier tests'
# Ray clients still alive, their locks possibly held at the fork) can hang before it reports.
CHILD = """
import json, os, sys, threading
from loongsage.controller.actors import pin_process

cpu = int(sys.argv[1])
before = threading.Thread(target=threading.Event().wait, args=(5,), daemon=True)
before.start()
pin_process([cpu])
seen = {}
after = threading.Thread(target=lambda: seen.setdefault("after", os.sched_getaffinity(0)))
after.start()
after.join()
masks = [sorted(os.sched_getaffinity(int(tid))) for tid in os.listdir("/proc/self/task")]
print(json.dumps({"masks": masks, "after": sorted(seen["after"])}))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")
def test_pin_process_pins_existing_and_later_threads() -> None:
    cpu = max(os.sched_getaffinity(0))
    result = subprocess.run([sys.executable, "-c", CHILD, str(cpu)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(report["masks"]) >= 2 and all(m == [cpu] for m in report["masks"])
    assert report["after"] == [cpu]
