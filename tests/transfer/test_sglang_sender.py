"""`SGLangDistributedSender` against two real HTTP servers in other processes that follow
SGLang's `/init_weights_update_group` + `/update_weights_from_distributed` shapes (a stand-in:
SGLang itself cannot run on a CPU machine), over a gloo group instead of NCCL."""

from __future__ import annotations

import base64
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from loongsage.transfer.sglang import SGLangDistributedSender, buckets_by_bytes

from .conftest import as_bytes, make_weights

pytestmark = pytest.mark.timeout(120)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def standins():
    procs, urls = [], []
    for _ in range(2):
        port = free_port()
        procs.append(subprocess.Popen([sys.executable, str(Path(__file__).with_name(
            "sglang_standin_server.py")), str(port)]))
        urls.append(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 60
    for url in urls:
        while True:
            try:
                httpx.get(f"{url}/health", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, f"{url} did not start"
                time.sleep(0.2)
    yield urls
    for proc in procs:
        proc.kill()
        proc.wait()


def test_buckets_keep_whole_tensors_in_order():
    weights = make_weights(seed=0, big=64 * 100, tiny=10)
    buckets = list(buckets_by_bytes(weights.items(), 1000))
    assert [n for b in buckets for n, _ in b] == list(weights)
    assert all(sum(t.numel() * t.element_size() for _, t in b) <= 1000 or len(b) == 1
               for b in buckets)


def test_sender_drives_sglang_shaped_servers_bitwise(standins):
    weights = make_weights(seed=11, big=64 * 500, tiny=60)
    sender = SGLangDistributedSender(standins, master_address="127.0.0.1",
                                     master_port=free_port(), backend="gloo", device="cpu",
                                     bucket_bytes=16 << 10, timeout_s=60)
    try:
        sender.init_group()
        assert sender.world_size == 3
        buckets = sender.sync(iter(weights.items()), version=4)
        assert buckets == len(list(buckets_by_bytes(weights.items(), 16 << 10))) == 2
        for url in standins:
            dumped = httpx.get(f"{url}/dump", timeout=30).json()
            assert dumped["version"] == "4" and dumped["calls"] == buckets
            got = {n: base64.b64decode(b) for n, b in dumped["weights"].items()}
            assert got == {n: as_bytes(t) for n, t in weights.items()}
    finally:
        sender.close()
