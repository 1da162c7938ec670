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
