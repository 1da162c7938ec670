"""TransferMesh between real processes: the pytest process or a sender actor sends, engine-host
Ray actors receive. Every assertion compares bytes, versions and payload sizes."""

from __future__ import annotations

import time

import pytest
import torch

from loongsage.transfer import TransferConfig, TransferMesh, WeightSyncError

from .conftest import as_bytes, make_weights

pytestmark = pytest.mark.timeout(180)

SMALL_BUCKET = 64 << 10  # the 1.2 MB embedding spans ~19 buckets


def expect_equal(ray, engine, key, weights):
    got = ray.get(engine.weight_bytes.remote(key))
    assert set(got) == set(weights)
    bad = [name for name, tensor in weights.items() if got[name] != as_bytes(tensor)]
    assert not bad, f"{len(bad)} tensors differ, e.g. {bad[:3]}"


def connect(ray, engine, key, mesh_or_addresses, host_id):
    addresses = mesh_or_addresses if isinstance(mesh_or_addresses, list) \
        else [mesh_or_addresses.address]
    return ray.get(engine.connect.remote(key, addresses, host_id))


def test_shm_and_gloo_deliver_awkward_layouts_bitwise(ray_cluster, engines):
    ray, (a, b) = ray_cluster, engines
    weights = make_weights(seed=1)
    with TransferMesh(TransferConfig(bucket_bytes=SMALL_BUCKET, checksum=True, timeout_s=30),
                      host_id="host-a") as mesh:
        connect(ray, a, "bitwise-shm", mesh, "host-a")
        connect(ray, b, "bitwise-gloo", mesh, "host-b")
        mesh.wait_for_receivers(2)
        report = mesh.sync(iter(weights.items()), version=1)
        assert report.transports == {"shm": ["bitwise-shm"], "gloo": ["bitwise-gloo"]}
        assert sorted(report.applied) == ["bitwise-gloo", "bitwise-shm"] and not report.failed
        assert report.num_buckets > 19
        assert report.tensor_bytes == sum(t.numel() * t.element_size() for t in weights.values())
        for engine, key in ((a, "bitwise-shm"), (b, "bitwise-gloo")):
            state = ray.get(engine.state.remote(key))
            assert state["version"] == 1 and state["applies"][0][0] == 1
            assert len(state["applies"]) == 1
            expect_equal(ray, engine, key, weights)
        weights2 = make_weights(seed=2)
        mesh.sync(iter(weights2.items()), version=2)
        expect_equal(ray, a, "bitwise-shm", weights2)
        expect_equal(ray, b, "bitwise-gloo", weights2)
    for engine, key in ((a, "bitwise-shm"), (b, "bitwise-gloo")):
        ray.get(engine.disconnect.remote(key))


def wait_for_error(ray, engine, key, timeout_s=30.0):
    """The receiver notices a dead sender on its own schedule (socket EOF, then cleanup)."""
    deadline = time.monotonic() + timeout_s
    state = ray.get(engine.state.remote(key))
    while not state["error"] and time.monotonic() < deadline:
        time.sleep(0.2)
        state = ray.get(engine.state.remote(key))
    return state


def test_sender_dying_mid_sync_leaves_receivers_on_previous_version(ray_cluster, engines,
                                                                    sender_host):
    ray, (a, b) = ray_cluster, engines
    sender = sender_host(TransferConfig(bucket_bytes=SMALL_BUCKET, timeout_s=15))
    address = ray.get(sender.address.remote())
    connect(ray, a, "death-shm", [address], "host-a")
    connect(ray, b, "death-gloo", [address], "host-b")
    ray.get(sender.wait_for_receivers.remote(2))
    report = ray.get(sender.sync.remote(seed=5, version=1))
    assert sorted(report["applied"]) == ["death-gloo", "death-shm"]
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(sender.sync.remote(seed=6, version=2, die_after=1000))
    v1 = make_weights(seed=5)
    for engine, key in ((a, "death-shm"), (b, "death-gloo")):
        state = wait_for_error(ray, engine, key)
        assert state["version"] == 1
        assert [v for v, _ in state["applies"]] == [1]
        assert "weight version 2 failed at bucket" in state["error"]
        assert "lost sender rank 0" in state["error"]
        expect_equal(ray, engine, key, v1)
        ray.get(engine.disconnect.remote(key))


def test_packing_error_is_reported_with_version_and_bucket(ray_cluster, engines):
    ray, (a, _) = ray_cluster, engines
    weights = make_weights(seed=3, tiny=50)

    def broken():
        yield from list(weights.items())[:3]
        raise RuntimeError("parameter gather failed")

    with TransferMesh(TransferConfig(bucket_bytes=SMALL_BUCKET, timeout_s=20),
                      host_id="host-a") as mesh:
        connect(ray, a, "abort", mesh, "host-a")
        mesh.wait_for_receivers(1)
        mesh.sync(iter(weights.items()), version=1)
        with pytest.raises(WeightSyncError, match=r"weight version 2 failed at bucket \d+: "
                                                  r"sender rank 0 failed while packing"):
            mesh.sync(broken(), version=2)
        assert ray.get(a.wait.remote("abort", 2, 2.0)) is False
        state = ray.get(a.state.remote("abort"))
        assert state["version"] == 1 and "aborted: RuntimeError: parameter gather failed" \
            in state["error"]
        expect_equal(ray, a, "abort", weights)
        report = mesh.sync(iter(make_weights(seed=4, tiny=50).items()), version=3)
        assert report.applied == ["abort"]
        expect_equal(ray, a, "abort", make_weights(seed=4, tiny=50))
    ray.get(a.disconnect.remote("abort"))


def step(weights: dict[str, torch.Tensor], names: list[str], count: int) -> None:
    for name in names:
        flat = weights[name].view(-1)
        flat[:count] = flat[:count] + 1


def test_delta_sync_sends_only_changes_and_late_joiner_gets_full(ray_cluster, engines):
    ray, (a, b) = ray_cluster, engines
    weights = make_weights(seed=7, tiny=300)
    full_bytes = sum(t.numel() * t.element_size() for t in weights.values())
    with TransferMesh(TransferConfig(bucket_bytes=SMALL_BUCKET, delta=True, timeout_s=30),
                      host_id="host-a") as mesh:
        connect(ray, a, "delta-early", mesh, "host-a")
        mesh.wait_for_receivers(1)
        first = mesh.sync(iter(weights.items()), version=1)
        assert first.base_version is None and first.payload_bytes >= full_bytes

        changed = ["model.embed_tokens.weight", "model.norm.weight"]
        step(weights, changed, count=10)
        second = mesh.sync(iter(weights.items()), version=2)
        assert second.base_version == 1
        # two sparse items: 10 (int32 index, fp32 value) pairs, padded to the 64-byte piece
        # alignment, then 10 (int32 index, bf16 value) pairs
        assert second.payload_bytes == 128 + 10 * (4 + 2)
        applies = ray.get(a.state.remote("delta-early"))["applies"]
        assert applies[-1] == (2, sorted(changed))
        expect_equal(ray, a, "delta-early", weights)

        connect(ray, b, "delta-late", mesh, "host-b")
        mesh.wait_for_receivers(2)
        step(weights, ["lm_head.bias"], count=3)
        third = mesh.sync(iter(weights.items()), version=3)
        assert third.base_version is None and third.payload_bytes >= full_bytes
        assert sorted(third.applied) == ["delta-early", "delta-late"]
        expect_equal(ray, b, "delta-late", weights)
        expect_equal(ray, a, "delta-early", weights)

        step(weights, ["model.scale"], count=1)
        fourth = mesh.sync(iter(weights.items()), version=4)
        # a one-element tensor is cheaper whole (4 bytes) than as an (index, value) pair
        assert fourth.base_version == 3 and fourth.payload_bytes == 4
        for engine, key in ((a, "delta-early"), (b, "delta-late")):
            assert ray.get(engine.state.remote(key))["applies"][-1] == (4, ["model.scale"])
            expect_equal(ray, engine, key, weights)
    for engine, key in ((a, "delta-early"), (b, "delta-late")):
        ray.get(engine.disconnect.remote(key))


def test_two_sender_ranks_each_send_their_shard(ray_cluster, engines):
    ray, (a, _) = ray_cluster, engines
    weights = make_weights(seed=9, tiny=200)
    names = sorted(weights)
    shards = [{n: weights[n] for n in names[0::2]}, {n: weights[n] for n in names[1::2]}]
    config = TransferConfig(bucket_bytes=SMALL_BUCKET, timeout_s=30)
    with TransferMesh(config, sender_rank=0, host_id="host-a") as m0, \
            TransferMesh(config, sender_rank=1, host_id="host-a") as m1:
        connect(ray, a, "sharded", [m0.address, m1.address], "host-a")
        m0.wait_for_receivers(1)
        m1.wait_for_receivers(1)
        import threading
        reports = {}
        threads = [threading.Thread(target=lambda r, m, s: reports.__setitem__(
            r, m.sync(iter(s.items()), version=1)), args=(r, m, s))
            for r, (m, s) in enumerate(zip((m0, m1), shards))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert reports[0].applied == ["sharded"] and reports[1].applied == ["sharded"]
        state = ray.get(a.state.remote("sharded"))
        assert [v for v, _ in state["applies"]] == [1]
        assert sorted(state["applies"][0][1]) == names
        expect_equal(ray, a, "sharded", weights)
    ray.get(a.disconnect.remote("sharded"))
