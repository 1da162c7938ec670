"""Fixtures for TransferMesh tests: one Ray session, engine-host actors, weight layouts.

Receivers run in Ray actors (separate processes, as rollout engines do); senders run in the
pytest process or, where a sender must die, in an actor of their own. A receiver that should
use the gloo path claims another host name (`host_id`): on one machine that is the only way to
exercise the cross-host transport, and gloo then really runs over TCP between two processes.
"""

from __future__ import annotations

import os
import sys

import httpx
import pytest
import torch

ray = pytest.importorskip("ray")
from ray import cloudpickle  # noqa: E402

from loongsage.transfer import TransferConfig, TransferMesh, WeightReceiver  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def make_weights(seed: int, *, big: int = 300_000, tiny: int = 2000) -> dict[str, torch.Tensor]:
    """An awkward layout: one fp32 tensor far larger than a test bucket, `tiny` tensors of a
    few elements, bf16 and fp16 mixed with fp32, a scalar and an empty tensor."""
    g = torch.Generator().manual_seed(seed)
    weights = {
        "model.embed_tokens.weight": torch.randn(big // 64, 64, generator=g),
        "model.norm.weight": torch.randn(576, generator=g).to(torch.bfloat16),
        "lm_head.bias": torch.randn(33, generator=g).to(torch.float16),
        "model.scale": torch.randn((), generator=g),
        "model.empty": torch.empty(0, 4),
    }
    for i in range(tiny):
        dtype = (torch.float32, torch.bfloat16, torch.float16)[i % 3]
        weights[f"model.layers.{i}.tiny.weight"] = torch.randn(1 + i % 5, generator=g).to(dtype)
    return weights


def as_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


class EngineHost:
    """Stands in for a rollout engine process: receivers apply into `weights` by copying, the
    way `EmbeddedRolloutEngine.apply_weights` copies into its parameters."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.receivers: dict[str, WeightReceiver] = {}
        self.weights: dict[str, dict[str, torch.Tensor]] = {}
        self.applies: dict[str, list[tuple[int, list[str]]]] = {}

    def connect(self, key: str, senders: list, host_id: str, timeout_s: float = 20.0,
                zero_copy: bool = False) -> str:
        self.weights[key], self.applies[key] = {}, []

        def apply(named_tensors, version: int) -> None:
            items = list(named_tensors)
            for name, tensor in items:
                self.weights[key][name] = tensor.clone()
            self.applies[key].append((version, [name for name, _ in items]))

        receiver = WeightReceiver(senders, apply, receiver_id=key, host_id=host_id,
                                  timeout_s=timeout_s, zero_copy=zero_copy)
        self.receivers[key] = receiver.start()
        return key

    def wait(self, key: str, version: int, timeout_s: float = 30.0) -> bool:
        return self.receivers[key].wait_for_version(version, timeout_s)

    def state(self, key: str) -> dict:
        r = self.receivers[key]
        return {"version": r.applied_version, "error": r.last_error,
                "applies": self.applies[key], "transports": r.transports,
                "zero_copy_versions": r.zero_copy_versions,
                "staging_bytes": sum(t.numel() * t.element_size() for t in r.staging.values())}

    def weight_bytes(self, key: str) -> dict[str, bytes]:
        return {name: as_bytes(t) for name, t in self.weights[key].items()}

    def disconnect(self, key: str) -> None:
        self.receivers.pop(key).close()


class SenderHost:
    """A trainer rank in its own process; `sync(..., die_after=k)` kills the process after
    the k-th tensor was handed to the mesh, i.e. in the middle of a version."""

    def __init__(self, config: TransferConfig) -> None:
        torch.set_num_threads(1)
        self.mesh = TransferMesh(config, host_id="host-a").start()

    def address(self):
        return self.mesh.address

    def wait_for_receivers(self, count: int) -> list[str]:
        return self.mesh.wait_for_receivers(count)

    def sync(self, seed: int, version: int, die_after: int | None = None) -> dict:
        def stream():
            for i, item in enumerate(make_weights(seed).items()):
                if die_after is not None and i == die_after:
                    os._exit(1)
                yield item

        return self.mesh.sync(stream(), version).as_dict()


@pytest.fixture(scope="session")
def engines(ray_cluster):
    """Two long-lived engine-host actors reused by every test (each test uses its own keys)."""
    host = ray_cluster.remote(num_cpus=0)(EngineHost)
    actors = [host.remote(), host.remote()]
    yield actors
    for actor in actors:
        ray_cluster.kill(actor)


@pytest.fixture
def sender_host(ray_cluster):
    made = []

    def start(config: TransferConfig):
        actor = ray_cluster.remote(num_cpus=0, max_restarts=0)(SenderHost).remote(config)
        made.append(actor)
        return actor

    yield start
    for actor in made:
        ray_cluster.kill(actor)


def trainer_weights(model_dir, seed: int) -> dict[str, torch.Tensor]:
    """The tiny model's HF state dict after a pretend train step (seeded noise), as
    `EmbeddedTrainEngine.named_tensors()` yields it (tied entries included)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.01)
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def generate(url: str) -> dict:
    body = {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 4,
                                                         "temperature": 0.0}}
    response = httpx.post(f"{url}/generate", json=body, timeout=60)
    response.raise_for_status()
    return response.json()


class RolloutHost:
    """A real `EmbeddedRolloutEngine` (tiny Qwen2, HTTP server started) whose weights a
    `WeightReceiver` swaps through `engine.apply_weights`, as the controller will wire it."""

    def __init__(self, model_dir: str) -> None:
        from loongsage.engines.embedded_rollout import EmbeddedRolloutEngine

        torch.set_num_threads(1)
        self.engine = EmbeddedRolloutEngine(model_dir, num_threads=1)
        self.url = self.engine.start()
        self.receiver: WeightReceiver | None = None

    def http_url(self) -> str:
        return self.url

    def connect(self, senders: list, host_id: str, zero_copy: bool = False,
                bind: bool = False) -> str:
        engine = self.engine
        self.receiver = WeightReceiver(senders, engine.apply_weights,
                                       receiver_id="rollout-engine", host_id=host_id,
                                       timeout_s=20, zero_copy=zero_copy,
                                       bind=engine.bind_weights if bind else None,
                                       lost=engine.weights_lost if bind else None).start()
        return self.url

    def private_weight_bytes(self) -> int:
        """Bytes of the model's parameters held in this process's own memory (not in a
        shared-memory file such as the weight-sync ring)."""
        storages = {p.untyped_storage().data_ptr(): p.untyped_storage()
                    for p in self.engine.model.parameters()}
        return sum(s.nbytes() for s in storages.values() if not s.filename)

    def state(self) -> dict:
        receiver = self.receiver
        return {"engine_version": self.engine.weight_version,
                "receiver_version": receiver.applied_version if receiver else None,
                "error": receiver.last_error if receiver else "",
                "zero_copy_versions": receiver.zero_copy_versions if receiver else 0}

    def weight_bytes(self) -> dict[str, bytes]:
        return {name: as_bytes(t) for name, t in self.engine.model.state_dict().items()}

    def tensor_bytes_outside_model(self) -> int:
        """Bytes of every live CPU tensor storage in this process that is neither the model's
        nor the shared-memory ring's: what a weight update left behind (a staging copy)."""
        import gc

        model = self.engine.model
        model = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
        seen, total = set(), 0
        for obj in gc.get_objects():
            if not isinstance(obj, torch.Tensor) or obj.device.type != "cpu":
                continue
            storage = obj.untyped_storage()
            if storage.data_ptr() in model or storage.data_ptr() in seen or storage.filename:
                continue
            seen.add(storage.data_ptr())
            total += storage.nbytes()
        return total

    def stop(self) -> None:
        if self.receiver is not None:
            self.receiver.close()
        self.engine.stop()
