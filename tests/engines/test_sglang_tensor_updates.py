"""SGLang's ``/update_weights_from_tensor`` on the embedded engine (real HTTP server, tiny model).

The sender runs in a child process, as a train rank does: it copies buckets into shared memory
(``shared_bucket``) and pickles them the way SGLang's ``MultiprocessingSerializer`` does, so only
handles cross HTTP and the server maps the child's segments (torch's ``file_system`` sharing;
on a GPU the same code sends CUDA IPC handles, which cannot run on this CPU machine). The
version lands bit-exact, only on the flushing request, and no segment is left behind. Bad
requests are 400s naming the field and change nothing.
"""

from __future__ import annotations

import base64
import gc
import io
import json
import os
import pickle
import re
import subprocess
import sys
from multiprocessing.reduction import ForkingPickler

import httpx
import pytest
import torch

from loongsage.engines.sglang.tensor_sender import (
    serialize_named_tensors,
    shared_bucket,
    tensor_request,
)

CHILD = r"""
import json, sys, torch
from loongsage.engines.sglang.distributed_sender import buckets_by_bytes
from loongsage.engines.sglang.tensor_sender import serialize_named_tensors, shared_bucket
named = torch.load(sys.argv[1])
keep = []  # the sender keeps every bucket until told the server answered
for bucket in buckets_by_bytes(named, int(sys.argv[2])):
    views = shared_bucket(bucket, "cpu")
    keep.append(views)
    print(json.dumps(serialize_named_tensors(views)), flush=True)
print("done", flush=True)
sys.stdin.readline()
del views
keep.clear()  # as the sender does once answered; a process that exits holding them leaves them to torch's shm manager
"""


def noisy(engine, seed: int) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(name, p.detach() + torch.randn(p.shape, generator=gen)) for name, p in engine.model.named_parameters()]


def post(engine, body: dict) -> httpx.Response:
    return httpx.post(engine.url + "/update_weights_from_tensor", json=body, timeout=60)


def torch_segments(pid: int) -> list[str]:
    return [name for name in os.listdir("/dev/shm") if name.startswith(f"torch_{pid}_")]


def test_buckets_from_another_process_land_bit_exact_on_the_flushing_request(engine, tmp_path):
    new = noisy(engine, seed=5)
    before = {name: p.detach().clone() for name, p in engine.model.named_parameters()}
    torch.save(new, tmp_path / "weights.pt")
    payload_bytes = sum(t.numel() * t.element_size() for _, t in new)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "weights.pt"), str(payload_bytes // 3)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        entries = [json.loads(line) for line in iter(child.stdout.readline, "done\n")]
        assert len(entries) >= 3  # several buckets, several requests
        assert sum(map(len, entries)) < payload_bytes / 50  # handles crossed HTTP, not the bytes
        for i, entry in enumerate(entries):
            last = i == len(entries) - 1
            reply = post(engine, tensor_request([entry], version=7, flush_cache=last))
            assert reply.status_code == 200, reply.text
            if not last:  # held until the flushing request: the engine still serves the old weights
                assert engine.scheduler.version == 0
                assert all(torch.equal(p, before[n]) for n, p in engine.model.named_parameters())
        assert reply.json()["weight_version"] == "7"
    finally:
        child.communicate("\n", timeout=30)
    assert engine.scheduler.version == 7
    state = dict(engine.model.named_parameters())
    assert all(torch.equal(state[name], tensor) for name, tensor in new)
    info = httpx.get(engine.url + "/get_server_info").json()["weight_update_requests"]
    assert info["/update_weights_from_tensor"] == len(entries) and info["/update_weights_from_distributed"] == 0
    engine.scheduler.call(lambda: None).result()  # the decode loop moves past the swap (its last task)
    gc.collect()
    assert torch_segments(child.pid) == []  # applied and released: nothing left in /dev/shm


def test_bad_tensor_updates_are_400_naming_the_field_and_change_nothing(engine):
    (name, tensor), (other, _) = noisy(engine, seed=6)[:2]
    good = serialize_named_tensors(shared_bucket([(name, tensor)], "cpu"))
    unknown = serialize_named_tensors(shared_bucket([("no.such.weight", torch.zeros(2))], "cpu"))
    wrong_shape = serialize_named_tensors(shared_bucket([(other, torch.zeros(3, 2))], "cpu"))
    by_fd = io.BytesIO()
    ForkingPickler(by_fd).dump([(name, tensor.clone())])  # torch's default strategy: a file descriptor

    class Exploit:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    cases = [
        ({"serialized_named_tensors": [good, good]}, "serialized_named_tensors", "one entry per TP rank"),
        ({"serialized_named_tensors": [unknown]}, "serialized_named_tensors", "unknown parameter 'no.such.weight'"),
        ({"serialized_named_tensors": [wrong_shape]}, "serialized_named_tensors", f"'{other}' has shape \\[3, 2\\]"),
        ({"serialized_named_tensors": ["not base64!"]}, "serialized_named_tensors", "not base64"),
        ({"serialized_named_tensors": [base64.b64encode(b"junk").decode()]}, "serialized_named_tensors",
         "not a ForkingPickler payload"),
        ({"serialized_named_tensors": [base64.b64encode(pickle.dumps([Exploit()])).decode()]},
         "serialized_named_tensors", "system is not allowed in a weight payload"),
        ({"serialized_named_tensors": [base64.b64encode(by_fd.getvalue()).decode()]},
         "serialized_named_tensors", "file_system"),
        ({"serialized_named_tensors": "x"}, "serialized_named_tensors", "list of base64 strings"),
        ({"serialized_named_tensors": [good], "load_format": "flattened_bucket"}, "load_format", "flattened_bucket"),
        ({"serialized_named_tensors": [good], "flush_cache": "yes"}, "flush_cache", "true or false"),
        ({"serialized_named_tensors": [good], "weight_version": "v2"}, "weight_version", "integer"),
    ]
    before = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    for body, field, message in cases:
        reply = post(engine, body)
        assert reply.status_code == 400, (body, reply.text)
        error = reply.json()["error"]
        assert error["field"] == field
        assert re.search(message, error["message"]), error["message"]
    # a held bucket is dropped by a failing request of its version: nothing of it applied
    assert post(engine, tensor_request([good], version=3, flush_cache=False)).status_code == 200
    assert post(engine, tensor_request([unknown], version=3, flush_cache=True)).status_code == 400
    assert engine.scheduler.version == 0
    empty = serialize_named_tensors([])
    assert post(engine, tensor_request([empty], version=3, flush_cache=True)).status_code == 200
    assert engine.scheduler.version == 3  # applied without the dropped bucket
    assert all(torch.equal(p, before[n]) for n, p in engine.model.named_parameters())
