"""``EngineHost`` (``loongsage.controller.actors``) in a real Ray actor hosting the tiny train engine.

Every engine call must run on the host's one compute thread: Ray hands successive calls of a
threaded actor to successive pool threads, and a train step on another thread cannot reuse
the memory the previous step freed in that thread's malloc arena (the train actor grew by
about a step's activations per pool thread). ``memory`` must answer while a call runs, and
its peak must see an allocation that is already freed again when the call returns.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from loongsage.controller.actors import spawn_engine
from loongsage.controller.placement import Seat
from loongsage.engines.cpu_threads import denormals_kept
from loongsage.engines.embedded_train import EmbeddedTrainEngine

MB = 1 << 20


def thread_of_call(engine) -> int:
    return threading.get_ident()


def hold_memory(engine, megabytes: int, seconds: float) -> int:
    block = torch.ones(megabytes * MB // 4)  # written, so resident
    time.sleep(seconds)
    del block
    return threading.get_ident()


@pytest.fixture(scope="module")
def host(tiny_model_dir, ray_cluster):
    ray = ray_cluster
    cfg = {"model": {"path": str(tiny_model_dir)}, "train": {"micro_batch_size": 2}}
    actor = spawn_engine(EmbeddedTrainEngine, cfg, Seat("train", 0, "", 0, num_cpus=0, num_gpus=0, threads=1))
    yield ray, actor
    ray.kill(actor)


def test_every_call_runs_on_one_compute_thread(host):
    ray, actor = host
    threads = {ray.get(actor.run.remote(thread_of_call)) for _ in range(8)}
    threads.add(ray.get(actor.run.remote(hold_memory, 1, 0.0)))
    assert len(threads) == 1


def test_memory_answers_during_a_call_and_sees_its_peak(host):
    ray, actor = host
    before = ray.get(actor.memory.remote())
    running = actor.run.remote(hold_memory, 300, 4.0)
    deadline = time.monotonic() + 2.5  # the call may take a moment to start and fill its block
    while True:
        during = ray.get(actor.memory.remote(), timeout=1.0)  # answered while the call holds its block
        if during["rss"] >= before["rss"] + 250 * MB or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not ray.wait([running], timeout=0)[0]
    ray.get(running)
    after = ray.get(actor.memory.remote())
    assert before["pid"] == during["pid"] == after["pid"] != os.getpid()
    assert during["rss"] >= before["rss"] + 250 * MB
    assert max(during["peak_rss"], after["peak_rss"]) >= before["rss"] + 250 * MB


def denormals_left(engine) -> int:
    return denormals_kept(1 << 16)


def test_the_compute_thread_flushes_denormals(host):
    """A trained model's backward pass makes denormals, which x86 computes slowly; the host's
    compute thread treats them as zero (``engines.cpu_threads``; the train engine itself leaves
    the thread it is built on alone)."""
    ray, actor = host
    assert ray.get(actor.run.remote(denormals_left)) == 0


def engine_kind(engine) -> str:
    return type(engine).__name__


def decode_threads(engine) -> int:
    return engine.scheduler.num_threads


def test_a_shared_engine_is_its_slot_of_the_host_process(tiny_model_dir, ray_cluster):
    """``placement.share_process``: a rollout engine built in a train rank's host answers the
    actor-handle calls as its own engine, on the host's compute thread, with a peak window of its
    own; killing the host's actor is what ends it."""
    from loongsage.controller.actors import actor_handle, add_shared_engine
    from loongsage.engines.embedded_rollout.engine import EmbeddedRolloutEngine

    ray = ray_cluster
    cfg = {"model": {"path": str(tiny_model_dir)}, "train": {"micro_batch_size": 2}, "rollout": {"num_threads": 0}}
    host = spawn_engine(EmbeddedTrainEngine, cfg, Seat("train", 0, "", 0, num_cpus=0, num_gpus=0, threads=1))
    shared = add_shared_engine(host, EmbeddedRolloutEngine, cfg, threads=2)
    assert ray.get(host.run.remote(engine_kind)) == "EmbeddedTrainEngine"
    assert ray.get(shared.run.remote(engine_kind)) == "EmbeddedRolloutEngine"
    assert ray.get(shared.inspect.remote(engine_kind)) == "EmbeddedRolloutEngine"
    assert ray.get(shared.call.remote("start")).startswith("http://")  # its server, in the host's process
    assert ray.get(shared.inspect.remote(decode_threads)) == 2  # the seat's, not the host's 1
    assert ray.get(shared.where.remote())["pid"] == ray.get(host.where.remote())["pid"]
    assert ray.get(shared.run.remote(thread_of_call)) == ray.get(host.run.remote(thread_of_call))

    ray.get([host.memory.remote(), shared.memory.remote()])  # both peak windows start now
    start = ray.get(host.memory.remote())["rss"]
    ray.get(host.run.remote(hold_memory, 200, 0.3))
    host_peak = ray.get(host.memory.remote())["peak_rss"]
    shared_report = ray.get(shared.memory.remote())
    assert shared_report["pid"] == ray.get(host.where.remote())["pid"]
    assert host_peak - start > 150 * MB and shared_report["peak_rss"] - start > 150 * MB  # each saw it

    assert actor_handle(shared) is host and actor_handle(host) is host
    ray.kill(actor_handle(shared))
    with pytest.raises(ray.exceptions.RayActorError):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # ray.kill does not wait: a call sent at once may still be served
            ray.get(shared.where.remote(), timeout=30)
            time.sleep(0.1)


def test_rollout_engines_share_a_process_only_where_the_run_and_the_engine_allow_it():
    from loongsage.controller.actors import shares_process
    from loongsage.engines.embedded_rollout.engine import EmbeddedRolloutEngine

    def cfg(mode="colocated", share=True):
        return {"placement": {"mode": mode, "share_process": share}}

    assert shares_process(cfg(), EmbeddedRolloutEngine)
    assert not shares_process(cfg(share=False), EmbeddedRolloutEngine)
    assert not shares_process(cfg(mode="disaggregated"), EmbeddedRolloutEngine)
    assert not shares_process(cfg(), EmbeddedTrainEngine)  # a class that does not say it can
