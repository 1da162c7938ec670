"""TransferMesh into the real embedded rollout engine (tiny Qwen2 in a Ray actor, HTTP
server running): engine weights end bitwise equal to the trainer's, the engine reports the
new version over HTTP, and a failed version leaves it serving the previous one. The receiver
runs zero-copy (the ring holds a version), so version 1 is copied and version 3 applied from
views of the shared segment; the staging copy of version 1 does not outlive its apply (no
tensor outside the model is left in the engine's process)."""

from __future__ import annotations

import httpx
import pytest

from loongsage.transfer import TransferConfig, TransferMesh, WeightSyncError

from .conftest import RolloutHost, as_bytes, generate, trainer_weights

pytestmark = pytest.mark.timeout(180)


def lost_after(weights: dict, count: int):
    """The trainer's tensors, its rank lost after ``count`` of them (a version failing midway)."""
    for i, item in enumerate(weights.items()):
        if i == count:
            raise RuntimeError("trainer rank lost")
        yield item


def test_engine_weights_bitwise_equal_and_failed_version_keeps_serving(ray_cluster,
                                                                       tiny_model_dir):
    ray = ray_cluster
    host = ray.remote(num_cpus=0)(RolloutHost).remote(str(tiny_model_dir))
    try:
        weights = trainer_weights(tiny_model_dir, seed=1)
        total = sum(t.numel() * t.element_size() + 64 for t in weights.values())
        config = TransferConfig(bucket_bytes=1 << 20, num_slots=2 + total // (1 << 20),
                                checksum=True, timeout_s=30)
        with TransferMesh(config, host_id="host-a") as mesh:
            url = ray.get(host.connect.remote([mesh.address], "host-a", True))
            mesh.wait_for_receivers(1)
            report = mesh.sync(iter(weights.items()), version=1)
            assert report.applied == ["rollout-engine"] and report.transports == {
                "shm": ["rollout-engine"]}
            got = ray.get(host.weight_bytes.remote())
            assert set(got) == set(weights)
            assert all(got[name] == as_bytes(t) for name, t in weights.items())
            # the staging copy version 1 went through was freed once applied: version 2 comes
            # as views, so the engine holds no second copy of the weights until then
            weight_total = sum(t.numel() * t.element_size() for t in weights.values())
            held = ray.get(host.tensor_bytes_outside_model.remote())
            assert held < 0.05 * weight_total, (held, weight_total)
            info = httpx.get(f"{url}/get_model_info", timeout=30).json()
            assert info["weight_version"] == "1"
            before = generate(url)
            assert before["meta_info"]["completion_tokens"] == 4

            with pytest.raises(WeightSyncError, match="weight version 2 failed at bucket"):
                mesh.sync(lost_after(trainer_weights(tiny_model_dir, seed=2), 5), version=2)
            state = ray.get(host.state.remote())
            assert state["engine_version"] == 1 and "weight version 2" in state["error"]
            assert ray.get(host.weight_bytes.remote()) == got
            after = generate(url)
            assert after["output_ids"] == before["output_ids"]
            third = trainer_weights(tiny_model_dir, seed=3)
            assert mesh.sync(iter(third.items()), version=3).applied == ["rollout-engine"]
            got = ray.get(host.weight_bytes.remote())
            assert all(got[name] == as_bytes(t) for name, t in third.items())
            state = ray.get(host.state.remote())
            assert state["engine_version"] == 3 and state["zero_copy_versions"] == 1
        ray.get(host.stop.remote())
    finally:
        ray.kill(host)


def test_bound_engine_keeps_the_ring_as_its_weights(ray_cluster, tiny_model_dir):
    """`bind`: from the second version on the engine's parameters are views of the sender's
    ring (no private copy), it generates exactly what the same weights copied give, and a
    version that fails after that leaves it refusing requests (its weights may be half
    overwritten) until the next version succeeds."""
    ray = ray_cluster
    host = ray.remote(num_cpus=0)(RolloutHost).remote(str(tiny_model_dir))
    try:
        first = trainer_weights(tiny_model_dir, seed=1)
        second = trainer_weights(tiny_model_dir, seed=2)
        total = sum(t.numel() * t.element_size() + 64 for t in first.values())
        config = TransferConfig(bucket_bytes=1 << 20, num_slots=2 + total // (1 << 20),
                                checksum=True, timeout_s=30)
        with TransferMesh(config, host_id="host-a") as mesh:
            url = ray.get(host.connect.remote([mesh.address], "host-a", True, True))
            mesh.wait_for_receivers(1)
            private = ray.get(host.private_weight_bytes.remote())
            mesh.sync(iter(first.items()), version=1)  # copied: the ring's fit is not known yet
            assert ray.get(host.private_weight_bytes.remote()) == private
            copied = generate(url)["output_ids"]
            assert mesh.sync(iter(second.items()), version=2).applied == ["rollout-engine"]
            assert ray.get(host.private_weight_bytes.remote()) == 0
            got = ray.get(host.weight_bytes.remote())
            assert all(got[name] == as_bytes(t) for name, t in second.items())
            assert mesh.sync(iter(first.items()), version=3).applied == ["rollout-engine"]
            assert generate(url)["output_ids"] == copied

            with pytest.raises(WeightSyncError, match="weight version 4 failed at bucket"):
                mesh.sync(lost_after(second, 5), version=4)
            state = ray.get(host.state.remote())
            assert state["engine_version"] == 3 and "may have overwritten" in state["error"]
            refused = generate(url)["meta_info"]["finish_reason"]
            assert refused["type"] == "abort" and "may have overwritten" in refused["message"]
            assert mesh.sync(iter(first.items()), version=5).applied == ["rollout-engine"]
            assert generate(url)["output_ids"] == copied
            assert ray.get(host.state.remote())["zero_copy_versions"] == 3
        ray.get(host.stop.remote())
    finally:
        ray.kill(host)
