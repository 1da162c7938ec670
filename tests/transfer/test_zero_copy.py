"""Zero-copy same-host receive (`WeightReceiver(zero_copy=True)`): once a version fits in the
sender's shared-memory ring, `apply` gets views of the segment instead of staging copies.
Receivers run in Ray actors; every assertion compares bytes and counts zero-copy versions."""

from __future__ import annotations

import pytest
import ray as ray_module

from loongsage.transfer import TransferConfig, TransferMesh

from .conftest import make_weights
from .test_mesh_processes import SMALL_BUCKET, expect_equal, wait_for_error

pytestmark = pytest.mark.timeout(180)


def ring_slots(weights) -> int:
    """Slots for one version of `weights` in SMALL_BUCKET buckets, with room to spare."""
    return 2 + sum(t.numel() * t.element_size() + 64 for t in weights.values()) // SMALL_BUCKET


def test_views_once_the_version_fits_and_copies_otherwise(ray_cluster, engines):
    ray, (a, b) = ray_cluster, engines
    weights = [make_weights(seed=s, tiny=300) for s in (20, 21, 22)]
    config = TransferConfig(bucket_bytes=SMALL_BUCKET, num_slots=ring_slots(weights[0]),
                            checksum=True, timeout_s=20)
    with TransferMesh(config, host_id="host-a") as mesh:
        ray.get(a.connect.remote("zc", [mesh.address], "host-a", 20.0, True))
        ray.get(b.connect.remote("zc-off", [mesh.address], "host-a", 20.0, False))
        mesh.wait_for_receivers(2)
        for version, w in enumerate(weights, start=1):
            report = mesh.sync(iter(w.items()), version)
            assert sorted(report.applied) == ["zc", "zc-off"]
            expect_equal(ray, a, "zc", w)
            expect_equal(ray, b, "zc-off", w)
            # freed as soon as version 1 was applied: that version fitted, so nothing reads it
            assert ray.get(a.state.remote("zc"))["staging_bytes"] == 0
        # version 1 taught the receiver that a version fits; 2 and 3 came as views, and the
        # staging copy version 1 needed was freed (the copying receiver keeps its mirror)
        zc, off = ray.get(a.state.remote("zc")), ray.get(b.state.remote("zc-off"))
        assert zc["zero_copy_versions"] == 2 and zc["staging_bytes"] == 0
        assert off["zero_copy_versions"] == 0
        assert off["staging_bytes"] == sum(t.numel() * t.element_size() for t in weights[0].values())
        ray.get(a.disconnect.remote("zc"))
        ray.get(b.disconnect.remote("zc-off"))
    small = TransferConfig(bucket_bytes=SMALL_BUCKET, num_slots=3, timeout_s=20)
    with TransferMesh(small, host_id="host-a") as mesh:
        ray.get(a.connect.remote("zc-small", [mesh.address], "host-a", 20.0, True))
        mesh.wait_for_receivers(1)
        for version, w in enumerate(weights, start=1):
            mesh.sync(iter(w.items()), version)
            expect_equal(ray, a, "zc-small", w)
        assert ray.get(a.state.remote("zc-small"))["zero_copy_versions"] == 0
        ray.get(a.disconnect.remote("zc-small"))


def test_a_version_given_as_a_list_comes_as_views_from_the_first(ray_cluster, engines):
    """A sender given a sequence announces the version's padded size in `Begin`: a receiver
    whose ring holds it takes version 1 as views too, never allocating staging; one given an
    iterator announces nothing (version 1 copied)."""
    ray, (a, _) = ray_cluster, engines
    weights = [make_weights(seed=s, tiny=300) for s in (40, 41)]
    config = TransferConfig(bucket_bytes=SMALL_BUCKET, num_slots=ring_slots(weights[0]),
                            timeout_s=20)
    with TransferMesh(config, host_id="host-a") as mesh:
        ray.get(a.connect.remote("zc-list", [mesh.address], "host-a", 20.0, True))
        mesh.wait_for_receivers(1)
        for version, w in enumerate(weights, start=1):
            assert mesh.sync(list(w.items()), version).applied == ["zc-list"]
            expect_equal(ray, a, "zc-list", w)
            state = ray.get(a.state.remote("zc-list"))
            assert state["zero_copy_versions"] == version and state["staging_bytes"] == 0
        ray.get(a.disconnect.remote("zc-list"))


def test_a_zero_copy_receiver_keeps_no_mirror_so_delta_senders_send_views(ray_cluster, engines):
    """A receiver that views the ring holds no copy of the weights for deltas to patch: a delta
    sender gives it full versions, applied from views, and their bytes are right."""
    ray, (a, _) = ray_cluster, engines
    weights = make_weights(seed=30, tiny=300)
    config = TransferConfig(bucket_bytes=SMALL_BUCKET, num_slots=ring_slots(weights), delta=True,
                            timeout_s=20)
    with TransferMesh(config, host_id="host-a") as mesh:
        ray.get(a.connect.remote("zc-delta", [mesh.address], "host-a", 20.0, True))
        mesh.wait_for_receivers(1)
        for version in (1, 2, 3):
            weights["model.embed_tokens.weight"].view(-1)[:10] += 1
            report = mesh.sync(iter(weights.items()), version)
            assert report.applied == ["zc-delta"] and report.base_version is None
            expect_equal(ray, a, "zc-delta", weights)
        state = ray.get(a.state.remote("zc-delta"))
        assert state["zero_copy_versions"] == 2 and state["staging_bytes"] == 0
        ray.get(a.disconnect.remote("zc-delta"))


def test_sender_death_mid_zero_copy_version_keeps_previous(ray_cluster, engines, sender_host):
    ray, (a, _) = ray_cluster, engines
    w = make_weights(seed=5)
    config = TransferConfig(bucket_bytes=SMALL_BUCKET, num_slots=ring_slots(w), timeout_s=10)
    sender = sender_host(config)
    ray.get(a.connect.remote("zc-death", [ray.get(sender.address.remote())], "host-a", 10.0,
                             True))
    ray.get(sender.wait_for_receivers.remote(1))
    for version, seed in ((1, 5), (2, 6)):
        assert ray.get(sender.sync.remote(seed=seed, version=version))["applied"] == ["zc-death"]
    assert ray.get(a.state.remote("zc-death"))["zero_copy_versions"] == 1
    with pytest.raises(ray_module.exceptions.RayActorError):
        ray.get(sender.sync.remote(seed=7, version=3, die_after=1000))
    state = wait_for_error(ray, a, "zc-death")
    assert state["version"] == 2 and [v for v, _ in state["applies"]] == [1, 2]
    assert "weight version 3 failed at bucket" in state["error"]
    expect_equal(ray, a, "zc-death", make_weights(seed=6))
    ray.get(a.disconnect.remote("zc-death"))
