"""The sender ring ``engines.mesh_sync`` sizes holds one whole version and not a slot more.

Every slot is ``bucket_bytes`` of touched shared memory in the trainer and in each engine, so
the count must be exact: the real tiny train engine's tensors are packed by the real
``BucketPacker`` and must take exactly ``ring_slots`` buckets, for bucket sizes that split
tensors at different places.
"""

from __future__ import annotations

import pytest
import torch

from loongsage.schema import ModelConfig, TrainConfig
from loongsage.engines.mesh_sync import ring_slots
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.transfer import TransferConfig
from loongsage.transfer.bucketing import BucketPacker, dense_item


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)), TrainConfig(), device="cpu")


def part_bytes(engine):
    return [t.numel() * t.element_size() for _, t in engine.named_tensors(include_tied=False)]


@pytest.mark.parametrize("bucket", [1 << 16, 100_032, 1 << 20, 64 << 20])
def test_ring_holds_exactly_one_version(engine, bucket):
    config = TransferConfig(bucket_bytes=bucket, num_slots=1)
    scratch = torch.empty(bucket, dtype=torch.uint8)
    packer = BucketPacker(bucket_bytes=bucket, num_slots=1, acquire=lambda slot: scratch, version=1,
                          sender_rank=0, base_version=None, checksum=False)
    items = [dense_item(name, tensor) for name, tensor in engine.named_tensors(include_tied=False)]
    assert sum(1 for _ in packer.pack(items)) == ring_slots(part_bytes(engine), config)


def test_configured_slots_are_a_floor(engine):
    assert ring_slots(part_bytes(engine), TransferConfig(bucket_bytes=64 << 20, num_slots=3)) == 3
