"""What a run's processes hold besides the work: no idle Ray workers, no freed engine memory
kept through the train phase.

Both checks use a real local cluster started by ``start_ray`` and a real ``EngineHost``
actor. The hosted engine is a stand-in (``HeapEngine``) that only allocates and frees heap
memory the way generation does; the scheduler and the train group ``ColocatedPhases``
drives are stand-ins too, since only the engines' side of the phase change is under test.

* Ray prestarts one worker per CPU for the first driver; a run's actors carry the job's
  runtime env, so those workers never took one and sat idle for the whole run (about 45 MB
  PSS each). ``start_ray`` turns the prestart off.
* Every actor's OpenMP threads wait as the driver's environment chose (``openmp_wait``).
* glibc keeps what a thread freed in its heap while a live block sits above it, so a
  colocated engine kept its generation's KV cache and activations through the train phase,
  on top of the trainer's peak; ``ColocatedPhases.to_train`` now has it hand them back.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from loongsage.controller.memory import process_tree, rss_bytes

MB = 1 << 20
HELD_MB = 200
# serial: it checks the cluster start_ray starts, so it stops any other one this process has
pytestmark = [pytest.mark.timeout(180), pytest.mark.serial]


class HeapEngine:
    """Generation's footprint in the heap: many blocks freed, the newest still alive."""

    @classmethod
    def from_config(cls, cfg, device):
        return cls()

    def generate(self, megabytes: int) -> int:
        blocks = [b"x" * 100_000 for _ in range(megabytes * MB // 100_000)]  # below mmap's threshold
        self.newest = blocks.pop()  # pins the top of the heap: free() cannot shrink it
        del blocks
        return rss_bytes()

    def offload(self) -> bool:
        return False

    def pid(self) -> int:
        return os.getpid()

    def openmp_wait(self) -> dict[str, str]:
        from loongsage.engines.openmp_wait import OPENMP_WAIT_VARIABLES

        return {name: os.environ[name] for name in OPENMP_WAIT_VARIABLES if name in os.environ}


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


@pytest.fixture(scope="module")
def engine_host():
    import ray

    from loongsage.controller.actors import spawn_engine, start_ray
    from loongsage.controller.placement import Seat

    saved = {key: os.environ.pop(key, None) for key in ("RAY_ADDRESS",)}
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():  # this module checks the cluster start_ray starts
        ray.shutdown()
    start_ray(SimpleNamespace(ray_address=None, num_cpus=2, object_store_memory=1 << 28))
    host = spawn_engine(HeapEngine, {}, Seat("rollout", 0, "", 0, num_cpus=0.5, num_gpus=0, threads=1))
    yield host, ray.get(host.call.remote("pid"))
    ray.shutdown()
    os.environ.update({key: value for key, value in saved.items() if value is not None})


def test_a_local_cluster_keeps_no_idle_workers(engine_host):
    host, engine_pid = engine_host
    time.sleep(3)  # the prestart, when on, begins as the driver connects, before any actor
    workers = {pid: cmdline(pid) for pid in process_tree(os.getpid())
               if cmdline(pid).startswith("ray::") and "Agent" not in cmdline(pid)}
    assert list(workers) == [engine_pid], workers


def test_actors_wait_on_openmp_as_the_driver_was_told(engine_host):
    import ray

    from loongsage.engines.openmp_wait import openmp_wait_env

    host, _ = engine_host
    # tests run with OMP_WAIT_POLICY=PASSIVE (tests/conftest.py): kept, and no spin count beside it
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert ray.get(host.call.remote("openmp_wait")) == openmp_wait_env(os.environ) == {"OMP_WAIT_POLICY": "PASSIVE"}


def test_to_train_hands_the_engines_freed_memory_back(engine_host):
    import ray

    from loongsage.controller.phases import ColocatedPhases

    host, _ = engine_host
    before = ray.get(host.memory.remote())["rss"]
    after_generate = ray.get(host.call.remote("generate", HELD_MB))
    assert after_generate - before > 0.8 * HELD_MB * MB  # the freed blocks stayed resident
    phases = ColocatedPhases(SimpleNamespace(pause=lambda: None), SimpleNamespace(call=lambda method: None), [host])
    phases.to_train()
    after_switch = ray.get(host.memory.remote())["rss"]
    assert after_generate - after_switch > 0.8 * HELD_MB * MB, (before, after_generate, after_switch)
