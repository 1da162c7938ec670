"""Packing, reassembly, delta encoding and transport choice, in one process (no transport)."""

from __future__ import annotations

import pytest
import torch

from loongsage.transfer.bucketing import (
    ALIGN,
    BucketPacker,
    IncompleteVersion,
    Reassembler,
    dense_item,
)
from loongsage.transfer.delta import DeltaShadow, sparse_item
from loongsage.transfer.frames import (
    ENCODING_DENSE,
    ENCODING_SPARSE32,
    ReceiverInfo,
    TransferConfig,
)
from loongsage.transfer.topology import SenderPlace, choose_transport, partition

BUCKET = 8192


def pack(items, *, checksum=False, num_slots=2, bucket=BUCKET):
    slots = [torch.zeros(bucket, dtype=torch.uint8) for _ in range(num_slots)]
    packer = BucketPacker(bucket_bytes=bucket, num_slots=num_slots, acquire=lambda s: slots[s],
                          version=3, sender_rank=0, base_version=None, checksum=checksum)
    frames = [(meta, payload.clone()) for meta, payload in packer.pack(items)]
    return packer, frames


def roundtrip(weights, **kw):
    packer, frames = pack([dense_item(n, t) for n, t in weights.items()], **kw)
    staging: dict[str, torch.Tensor] = {}
    asm = Reassembler(staging)
    for meta, payload in frames:
        asm.write(meta, payload)
    names = asm.finish(packer.num_buckets, packer.payload_bytes)
    return packer, frames, staging, names


def test_tensor_larger_than_bucket_is_split_and_reassembled_bitwise():
    big = torch.randn(10_000)  # 40,000 bytes = 4.9 buckets
    packer, frames, staging, _ = roundtrip({"big": big, "after": torch.arange(7.0)})
    assert packer.num_buckets == 5
    pieces = [s for meta, _ in frames for s in meta.specs if s.name == "big"]
    assert [p.item_offset for p in pieces] == [0, 8192, 16384, 24576, 32768]
    assert sum(p.nbytes for p in pieces) == big.numel() * 4
    assert torch.equal(staging["big"], big) and torch.equal(staging["after"], torch.arange(7.0))


def test_thousands_of_tiny_mixed_dtype_tensors(tmp_path):
    g = torch.Generator().manual_seed(0)
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    weights = {f"t{i}": torch.randn(1 + i % 9, generator=g).to(dtypes[i % 3])
               for i in range(3000)}
    weights["scalar"], weights["empty"] = torch.tensor(2.5), torch.empty(0, 3)
    packer, frames, staging, names = roundtrip(weights)
    assert set(names) == set(weights)
    for name, tensor in weights.items():
        got = staging[name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape
        assert torch.equal(got.view(-1).view(torch.uint8), tensor.view(-1).view(torch.uint8))
    offsets = [s.offset for meta, _ in frames for s in meta.specs]
    assert all(o % ALIGN == 0 for o in offsets)
    assert packer.payload_bytes <= sum(meta.nbytes for meta, _ in frames)
    assert all(meta.nbytes <= BUCKET for meta, _ in frames)


def test_checksum_and_missing_bucket_are_rejected():
    packer, frames = pack([dense_item("w", torch.randn(5000))], checksum=True)
    assert all(meta.checksum is not None for meta, _ in frames)
    meta, payload = frames[1]
    payload[10] ^= 0xFF
    asm = Reassembler({})
    asm.write(*frames[0])
    with pytest.raises(IncompleteVersion, match="bucket 1 checksum mismatch"):
        asm.write(meta, payload)
    asm = Reassembler({})
    asm.write(*frames[0])
    with pytest.raises(IncompleteVersion, match=r"buckets \[1, 2\] of 3 never arrived"):
        asm.finish(packer.num_buckets, packer.payload_bytes)


def test_sparse_delta_picks_cheapest_encoding_and_patches_exactly():
    old = torch.randn(1000).to(torch.bfloat16)
    assert sparse_item("w", old.clone(), old) is None
    few = old.clone()
    few[[3, 500, 999]] += 1
    item = sparse_item("w", few, old)
    assert item.encoding == ENCODING_SPARSE32 and item.count == 3
    assert item.nbytes == 3 * (4 + 2)
    many = old + 1
    assert sparse_item("w", many, old).encoding == ENCODING_DENSE
    staging = {"w": old.clone()}
    packer, frames = pack([item])
    asm = Reassembler(staging)
    for meta, payload in frames:
        asm.write(meta, payload)
    asm.finish(packer.num_buckets, packer.payload_bytes)
    assert torch.equal(staging["w"].view(torch.int16), few.view(torch.int16))


def test_delta_shadow_skips_unchanged_tensors():
    shadow = DeltaShadow()
    weights = {"a": torch.randn(100), "b": torch.randn(100)}
    assert [i.name for i in shadow.items(weights.items(), delta=False, keep=True)] == ["a", "b"]
    weights["b"][7] = 0.0
    items = list(shadow.items(weights.items(), delta=True, keep=True))
    assert [(i.name, i.count) for i in items] == [("b", 1)]
    assert shadow.tensor_bytes == 800


def test_transport_table():
    sender = SenderPlace("node-a", "cuda:0")
    cases = {
        ReceiverInfo("same-gpu", "node-a", "cuda:0"): "cuda_ipc",
        ReceiverInfo("other-gpu", "node-a", "cuda:1"): "nccl",
        ReceiverInfo("remote-gpu", "node-b", "cuda:0"): "nccl",
        ReceiverInfo("local-cpu", "node-a", "cpu"): "shm",
        ReceiverInfo("remote-cpu", "node-b", "cpu"): "gloo",
    }
    for info, expected in cases.items():
        assert choose_transport(sender, info) == expected
    assert partition(sender, cases)["nccl"] == ["other-gpu", "remote-gpu"]
    with pytest.raises(ValueError, match="ReceiverInfo.device"):
        choose_transport(sender, ReceiverInfo("x", "node-a", "tpu"))


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="transfer.bucket_bytes"):
        TransferConfig(bucket_bytes=10)
    with pytest.raises(ValueError, match="transfer.num_slots"):
        TransferConfig(num_slots=0)
