"""`SGLangDistributedSender` against real embedded rollout engines (tiny Qwen2, HTTP server
started, each in its own Ray actor) through SGLang's `/init_weights_update_group`,
`/update_weights_from_distributed` and `/destroy_weights_update_group`, over gloo (the CPU
stand-in for NCCL: same code, another backend). Engine weights are compared byte for byte."""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid

import httpx
import pytest
import torch

from loongsage.transfer import WeightSyncError
from loongsage.engines.sglang.distributed_sender import SGLangDistributedSender, buckets_by_bytes

from .conftest import RolloutHost, as_bytes, generate, make_weights, trainer_weights

pytestmark = pytest.mark.timeout(180)

BUCKET = 1 << 20  # the tiny model's ~13 MB spread over a dozen requests


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def rollout(ray_cluster, tiny_model_dir):
    """Two real engines in two processes, so the group has world size 3 and rank offsets 1, 2."""
    actor = ray_cluster.remote(num_cpus=0)(RolloutHost)
    hosts = [actor.remote(str(tiny_model_dir)) for _ in range(2)]
    urls = [ray_cluster.get(h.http_url.remote()) for h in hosts]
    yield hosts, urls
    for host in hosts:
        ray_cluster.get(host.stop.remote())
        ray_cluster.kill(host)


def make_sender(urls, **kwargs) -> SGLangDistributedSender:
    sender = SGLangDistributedSender(urls, master_address="127.0.0.1", master_port=free_port(),
                                     group_name=f"test-{uuid.uuid4().hex[:8]}", backend="gloo",
                                     device="cpu", bucket_bytes=BUCKET, timeout_s=60, **kwargs)
    sender.init_group()
    return sender


def version_of(url: str) -> str:
    return httpx.get(f"{url}/get_weight_version", timeout=30).json()["weight_version"]


def test_buckets_keep_whole_tensors_in_order():
    weights = make_weights(seed=0, big=64 * 100, tiny=10)
    buckets = list(buckets_by_bytes(weights.items(), 1000))
    assert [n for b in buckets for n, _ in b] == list(weights)
    assert all(sum(t.numel() * t.element_size() for _, t in b) <= 1000 or len(b) == 1
               for b in buckets)


def test_sync_into_real_engines_bitwise_with_mixed_wire_dtypes(ray_cluster, rollout,
                                                                tiny_model_dir):
    hosts, urls = rollout
    weights = trainer_weights(tiny_model_dir, seed=3)
    # the norms travel as bf16 (as a bf16 trainer sends them); the fp32 engine upcasts exactly
    sent = {n: t.to(torch.bfloat16) if "norm" in n else t for n, t in weights.items()}
    expected = {n: as_bytes(t.float()) for n, t in sent.items()}
    sender = make_sender(urls)
    try:
        assert sender.world_size == 3
        buckets = sender.sync(iter(sent.items()), version=4)
        assert buckets == len(list(buckets_by_bytes(sent.items(), BUCKET))) >= 4
        for host, url in zip(hosts, urls):
            got = ray_cluster.get(host.weight_bytes.remote())
            assert set(got) == set(expected)
            bad = [n for n in expected if got[n] != expected[n]]
            assert not bad, f"{len(bad)} tensors differ, e.g. {bad[:3]}"
            assert version_of(url) == "4"
            assert generate(url)["meta_info"]["weight_version"] == "4"
    finally:
        sender.close()


def test_bad_request_mid_update_keeps_previous_version_serving(ray_cluster, rollout,
                                                                tiny_model_dir):
    hosts, urls = rollout
    sender = make_sender(urls[:1])
    host, url = hosts[0], urls[0]
    try:
        sender.sync(iter(trainer_weights(tiny_model_dir, seed=5).items()), version=10)
        before_bytes, before_out = ray_cluster.get(host.weight_bytes.remote()), generate(url)
        # a tensor the model does not have, in the middle of the update (after good buckets)
        items = list(trainer_weights(tiny_model_dir, seed=6).items())
        at = len(items) // 2
        broken = items[:at] + [("model.layers.0.mlp.bogus.weight", torch.ones(3))] + items[at:]
        bad = next(i for i, b in enumerate(buckets_by_bytes(broken, BUCKET))
                   if any(n.endswith("bogus.weight") for n, _ in b))
        assert 1 <= bad < len(list(buckets_by_bytes(broken, BUCKET))) - 1
        with pytest.raises(WeightSyncError, match=rf"(?s)weight version 11 failed at bucket {bad}"
                           rf".*request {bad + 1} of weight version 11: unknown parameter "
                           r"'model.layers.0.mlp.bogus.weight'"):
            sender.sync(iter(broken), version=11)
        assert version_of(url) == "10"
        assert ray_cluster.get(host.weight_bytes.remote()) == before_bytes
        assert generate(url)["output_ids"] == before_out["output_ids"]
        # the group is still in step: the next version goes through whole
        good = trainer_weights(tiny_model_dir, seed=7)
        sender.sync(iter(good.items()), version=12)
        assert version_of(url) == "12"
        got = ray_cluster.get(host.weight_bytes.remote())
        assert all(got[n] == as_bytes(t) for n, t in good.items())
    finally:
        sender.close()


DYING_SENDER = """
import os, sys
import torch
from transformers import AutoModelForCausalLM
from loongsage.engines.sglang.distributed_sender import SGLangDistributedSender, buckets_by_bytes
url, port, group, model_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
torch.set_num_threads(1)
items = list(AutoModelForCausalLM.from_pretrained(model_dir).state_dict().items())
# sync() looks two buckets ahead, so dying on bucket 3's first tensor means buckets 0 and 1
# were delivered (without flush_cache) and the rest never will be
fatal = list(buckets_by_bytes(items, {bucket}))[3][0][0]
def stream():
    for name, tensor in items:
        if name == fatal:
            os._exit(3)
        yield name, tensor
sender = SGLangDistributedSender([url], master_address="127.0.0.1", master_port=port,
                                 group_name=group, backend="gloo", device="cpu",
                                 bucket_bytes={bucket}, timeout_s=60)
sender.init_group()
sender.sync(stream(), version=21)
"""


def test_sender_dying_mid_update_leaves_previous_version_and_engine_recovers(
        ray_cluster, rollout, tiny_model_dir):
    hosts, urls = rollout
    host, url = hosts[1], urls[1]
    first = make_sender([url])
    first.sync(iter(trainer_weights(tiny_model_dir, seed=8).items()), version=20)
    first.close()
    before_bytes, before_out = ray_cluster.get(host.weight_bytes.remote()), generate(url)
    group = f"dying-{uuid.uuid4().hex[:8]}"
    proc = subprocess.run([sys.executable, "-c", DYING_SENDER.format(bucket=BUCKET), url,
                           str(free_port()), group, str(tiny_model_dir)],
                          timeout=120, capture_output=True, text=True)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert version_of(url) == "20"
    assert ray_cluster.get(host.weight_bytes.remote()) == before_bytes
    assert generate(url)["output_ids"] == before_out["output_ids"]
    response = httpx.post(f"{url}/destroy_weights_update_group", json={"group_name": group},
                          timeout=30)
    assert response.status_code == 200 and response.json()["success"] is True
    sender = make_sender([url])
    try:
        good = trainer_weights(tiny_model_dir, seed=10)
        sender.sync(iter(good.items()), version=22)
        assert version_of(url) == "22"
        got = ray_cluster.get(host.weight_bytes.remote())
        assert all(got[n] == as_bytes(t) for n, t in good.items())
    finally:
        sender.close()


def test_malformed_requests_name_the_field(rollout):
    _, urls = rollout
    url = urls[0]
    cases = [
        ("/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 1,
                                        "rank_offset": 0, "world_size": 2, "group_name": "g",
                                        "backend": "gloo"}, "rank_offset"),
        ("/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 1,
                                        "rank_offset": 1, "world_size": 2, "group_name": "g",
                                        "backend": "mpi"}, "backend"),
        ("/update_weights_from_distributed", {"names": ["a"], "dtypes": ["float32"],
                                              "shapes": [[1]], "group_name": "missing"},
         "group_name"),
        ("/destroy_weights_update_group", {"group_name": "missing"}, "group_name"),
    ]
    for path, body, field in cases:
        response = httpx.post(f"{url}{path}", json=body, timeout=30)
        assert response.status_code == 400, (path, body)
        data = response.json()
        assert data["success"] is False and data["error"]["field"] == field, data
