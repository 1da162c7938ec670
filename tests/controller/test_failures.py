"""``loongsage.controller.failures``: which actor died, and whether Ray's memory monitor did it.

A real Ray cluster in a subprocess (the kill threshold is an environment variable read when
Ray starts) with two real engine hosts on the tiny model; one of them allocates until the
memory monitor kills it. ``dead_actors`` must name that one, as killed for memory, and leave
the other alone.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# its kill threshold is the machine's use now plus 5 GB: a test beside it could cross it
pytestmark = pytest.mark.serial

SCRIPT = r'''
import json, os, sys
from loongsage.controller.memory import machine_memory
total, available = machine_memory()
# kill once the machine holds 5 GB more than now; the victim asks for 9 GB
os.environ["RAY_memory_usage_threshold"] = str(round((total - available + 5e9) / total, 3))
os.environ["RAY_memory_monitor_refresh_ms"] = "100"
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
import ray, torch
from loongsage.controller.actors import spawn_engine
from loongsage.controller.failures import dead_actors, describe
from loongsage.controller.placement import Seat
from loongsage.engines.embedded_train import EmbeddedTrainEngine

def hog(engine):
    blocks = [torch.ones(1 << 28) for _ in range(9)]  # 9 x 1 GiB, written
    return len(blocks)

ray.init(num_cpus=2, include_dashboard=False, object_store_memory=1 << 28)
cfg = {"model": {"path": sys.argv[1]}}
actors = {role: spawn_engine(EmbeddedTrainEngine, cfg, Seat(role, 0, "", 0, num_cpus=0, num_gpus=0, threads=1)) for role in ("train", "rollout0")}
ray.get([a.memory.remote() for a in actors.values()])
try:
    ray.get(actors["rollout0"].run.remote(hog))
    outcome = "survived"
except ray.exceptions.OutOfMemoryError:
    outcome = "killed"
deaths = dead_actors(actors, timeout_s=20)
print(json.dumps({"outcome": outcome, "deaths": [d.__dict__ for d in deaths],
                  "described": [describe(d) for d in deaths]}))
'''


def test_memory_monitor_kill_is_named_as_such(tiny_model_dir):
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model_dir)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["outcome"] == "killed"
    assert [(d["role"], d["out_of_memory"]) for d in report["deaths"]] == [("rollout0", True)]
    assert "running low on memory" in report["deaths"][0]["reason"]
    assert report["described"][0].startswith("Ray's memory monitor killed rollout engine 'rollout0' (")
