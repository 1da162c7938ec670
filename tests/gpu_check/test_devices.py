"""The ``--cpu`` dry run of the GPU check's moves (benchmarks/gpu_devices.py) fails on the
CUDA-only mistakes it exists to catch.

On a CPU, offload/onload are no-ops, so the real engines' ``onload()`` is run towards the
``meta`` device and every tensor that must move is asserted there through ``torch.device``.
Real engines on the tiny model; the planted mistakes are the engines' own move functions
replaced by ones that forget part of the state (what a CUDA-only bug would look like).
"""

from __future__ import annotations

import pytest
import torch

from loongsage.controller.sft import Demonstration, sft_batch, token_mean_nll
from loongsage.engines.embedded_rollout import engine as rollout_module
from loongsage.engines.embedded_rollout.engine import EmbeddedRolloutEngine
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.engines import memory
from loongsage.schema import ModelConfig, TrainConfig


@pytest.fixture
def engines(tiny_model_dir):
    trainer = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)), TrainConfig(lr=1e-4), device="cpu")
    demo = Demonstration([{"role": "user", "content": "2 + 3?"}], [{"role": "assistant", "content": "5"}])
    trainer.train_step(sft_batch(trainer.tokenizer, [demo] * 2), token_mean_nll)  # AdamW state exists
    rollout = EmbeddedRolloutEngine(str(tiny_model_dir), seed=1, num_threads=1)
    rollout.start()
    yield trainer, rollout
    rollout.stop()


def test_dry_run_puts_every_tensor_that_must_move_on_meta(engines, bench):
    devices = bench("gpu_devices")
    trainer, rollout = engines
    params = sum(1 for _ in trainer.model.parameters())
    buffers = sum(1 for _ in trainer.model.buffers())
    state = sum(1 for s in trainer.optimizer.state.values() for v in s.values() if v.dim() > 0)
    # params + buffers + exp_avg and exp_avg_sq of each param (gradients are None between steps)
    assert state == 2 * params and buffers > 0
    assert devices.assert_on(devices.train_state_tensors(trainer), "cpu", "before") == params + buffers + state
    counts = devices.dry_run_onload(trainer, rollout)
    assert counts["train_tensors_on_meta"] == params + buffers + state
    assert counts["rollout_tensors_on_meta"] == sum(1 for _ in devices.module_tensors(rollout.model))
    assert all(p.device == torch.device("meta") for p in rollout.model.parameters())


def test_dry_run_fails_on_optimizer_state_left_on_the_host(engines, bench, monkeypatch):
    devices = bench("gpu_devices")
    monkeypatch.setattr(memory, "_move_optimizer_state", lambda optimizer, device: None)
    with pytest.raises(devices.DevicePlacementError, match=r"train onload \(dry run\): .*optimizer\.state\[0\]\.exp_avg on cpu"):
        devices.dry_run_onload(*engines)


def test_dry_run_fails_on_rollout_buffers_left_on_the_host(engines, bench, monkeypatch):
    devices = bench("gpu_devices")

    def parameters_only(model, device):  # forgets the buffers (rotary inv_freq)
        for module in model.modules():
            for name, param in module._parameters.items():
                if param is not None:
                    module._parameters[name] = torch.nn.Parameter(param.to(device), param.requires_grad)
        return True

    monkeypatch.setattr(rollout_module, "onload_module", parameters_only)
    with pytest.raises(devices.DevicePlacementError, match=r"rollout onload \(dry run\): .*inv_freq on cpu"):
        devices.dry_run_onload(*engines)
