"""A sender whose weights live in its own ring (``TransferMesh.place_in_ring`` + the real tiny
``EmbeddedTrainEngine.keep_weights_in``), into the real embedded rollout engine bound to the
ring (Ray actor, HTTP server running): the trainer's parameters are views of the shared
segment, the optimizer steps them there, a sync delivers them without copying, and the host
holds one copy of the weights. A sync whose tensors differ from the placed ones is refused
before it writes anything."""

from __future__ import annotations

import random

import pytest
import torch

from loongsage.engines.batch import TrainBatch
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.schema import ModelConfig, TrainConfig
from loongsage.transfer import TransferConfig, TransferMesh, WeightSyncError
from loongsage.transfer.bucketing import BucketPacker, copy_bytes, dense_item, ring_offsets

from .conftest import RolloutHost, as_bytes, generate

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("bucket", [4096, 4100, 100_032])
def test_ring_offsets_are_where_the_packer_writes(bucket):
    """Item sizes that end on, before and past bucket edges (zero-size ones too), against the
    packer's own frames: each item's first piece is at ``ring_offsets``' offset."""
    rng = random.Random(bucket)
    sizes = [rng.choice([0, 4, 60, 64, 4032, bucket, bucket - 4, 3 * bucket + 12])
             for _ in range(60)]
    items = [dense_item(f"t{i}", torch.zeros(n, dtype=torch.uint8)) for i, n in enumerate(sizes)]
    scratch = torch.empty(bucket, dtype=torch.uint8)
    packer = BucketPacker(bucket_bytes=bucket, num_slots=1, acquire=lambda slot: scratch,
                          version=1, sender_rank=0, base_version=None, checksum=False)
    first = {}
    for meta, _ in packer.pack(items):
        for spec in meta.specs:
            if spec.item_offset == 0:
                first.setdefault(spec.name, meta.index * bucket + spec.offset)
    assert [first[f"t{i}"] for i in range(len(sizes))] == ring_offsets(sizes, bucket)


def test_copy_bytes_skips_a_piece_already_in_place():
    buf = torch.arange(64, dtype=torch.uint8)
    copy_bytes(buf[8:16], buf[8:16])
    copy_bytes(buf[0:8], buf[8:16])
    assert buf[:8].tolist() == list(range(8, 16))


def batch() -> TrainBatch:
    ids = torch.tensor([[5, 17, 42, 99, 7, 64, 11, 12, 13, 14]])
    mask = torch.zeros(ids.shape)
    mask[0, 6:] = 1
    return TrainBatch(ids, torch.ones_like(ids), mask, {})


def nll(ctx):
    return -(ctx.logprobs * ctx.batch.loss_mask).sum() / ctx.global_num_tokens


def private_bytes(model: torch.nn.Module) -> int:
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage() for p in model.parameters()}
    return sum(s.nbytes() for s in storages.values() if not s.filename)


def test_trainer_weights_in_the_ring_reach_a_bound_engine_without_a_copy(ray_cluster,
                                                                        tiny_model_dir):
    ray = ray_cluster
    trainer = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)), TrainConfig(lr=1e-2),
                                  device="cpu")
    named = list(trainer.named_tensors(include_tied=False))
    before = {name: t.clone() for name, t in named}
    total = sum(t.numel() * t.element_size() + 64 for _, t in named)
    config = TransferConfig(bucket_bytes=1 << 20, num_slots=1 + total // (1 << 20), timeout_s=30)
    host = ray.remote(num_cpus=0)(RolloutHost).remote(str(tiny_model_dir))
    try:
        with TransferMesh(config, host_id="host-a") as mesh:
            moved = trainer.keep_weights_in(mesh.place_in_ring, {name for name, _ in named})
            assert sorted(moved) == sorted(name for name, _ in named)
            assert private_bytes(trainer.model) == 0
            arena = mesh._ctx.ring.arena
            start, end = arena.data_ptr(), arena.data_ptr() + arena.numel()
            assert all(start <= p.data_ptr() < end for p in trainer.model.parameters())
            assert trainer.model.lm_head.weight is trainer.model.model.embed_tokens.weight
            assert all(torch.equal(t, before[name])
                       for name, t in trainer.named_tensors(include_tied=False))

            url = ray.get(host.connect.remote([mesh.address], "host-a", True, True))
            mesh.wait_for_receivers(1)
            for version in (1, 2):
                trainer.train_step(batch(), nll)  # AdamW writes into the ring
                report = mesh.sync(list(trainer.named_tensors(include_tied=False)), version)
                assert report.applied == ["rollout-engine"]
                got = ray.get(host.weight_bytes.remote())
                assert all(got[name] == as_bytes(t)
                           for name, t in trainer.named_tensors(include_tied=True))
            assert ray.get(host.private_weight_bytes.remote()) == 0
            assert not torch.equal(trainer.model.model.embed_tokens.weight,
                                   before["model.embed_tokens.weight"])
            served = generate(url)["output_ids"]

            # a sequence other than the placed one is refused before anything is written
            held = {name: t.clone() for name, t in trainer.named_tensors(include_tied=False)}
            reordered = list(reversed(list(trainer.named_tensors(include_tied=False))))
            with pytest.raises(WeightSyncError, match="the ring placed"):
                mesh.sync(reordered, version=3)
            assert all(torch.equal(t, held[name])
                       for name, t in trainer.named_tensors(include_tied=False))
            assert mesh.sync(list(trainer.named_tensors(include_tied=False)), 4).applied == [
                "rollout-engine"]
            assert generate(url)["output_ids"] == served
        ray.get(host.stop.remote())
    finally:
        ray.kill(host)


@pytest.mark.parametrize("in_ring", [True, False])
def test_a_colocated_train_rank_starts_its_sender_with_its_weights_in_the_ring(tiny_model_dir,
                                                                              in_ring):
    """``actor_start_sender`` as a colocated run calls it (``MeshWeightSync(bind_views=True)``
    passes ``in_ring``): the rank's parameters leave private memory for the ring; otherwise
    they stay where they were."""
    from loongsage.engines import mesh_sync

    trainer = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)), TrainConfig(),
                                  device="cpu")
    held = private_bytes(trainer.model)
    try:
        mesh_sync.actor_start_sender(trainer, TransferConfig(bucket_bytes=1 << 20), 0, 1,
                                     in_ring=in_ring)
        assert private_bytes(trainer.model) == (0 if in_ring else held)
    finally:
        mesh_sync.actor_close(trainer)
