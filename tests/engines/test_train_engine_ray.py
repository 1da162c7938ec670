"""The train engine hosted in a real Ray actor: construction, a train step, numpy weights."""

from __future__ import annotations

import pytest
import torch

from loongsage.schema import ModelConfig, TrainConfig
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.controller.sft import Demonstration, sft_batch, token_mean_nll


@pytest.mark.slow
def test_engine_runs_in_a_ray_actor(tiny_model_dir, ray_cluster):
    ray = ray_cluster
    # one thread on both sides: AdamW's first step is g / (|g| + eps), so a gradient entry near
    # zero turns the summation order of a different thread count into a visible weight change
    model, train = ModelConfig(path=str(tiny_model_dir)), TrainConfig(lr=1e-3, micro_batch_size=2, num_threads=1)
    actor = ray.remote(EmbeddedTrainEngine).options(num_cpus=1).remote(model, train, device="cpu")
    threads = torch.get_num_threads()
    try:
        local = EmbeddedTrainEngine(model, train, device="cpu")
        messages = [{"role": "user", "content": "What is 2 + 3?"}]
        demo = Demonstration(messages, [{"role": "assistant", "content": "\\boxed{5}"}])
        batch = sft_batch(local.tokenizer, [demo] * 3)
        remote_metrics = ray.get(actor.train_step.remote(batch, token_mean_nll))
        local_metrics = local.train_step(batch, token_mean_nll)
        assert remote_metrics["train/loss"] == pytest.approx(local_metrics["train/loss"], rel=1e-6)
        remote_norm, local_norm = remote_metrics["train/grad_norm"], local_metrics["train/grad_norm"]
        assert remote_norm == pytest.approx(local_norm, rel=1e-5)
        state = ray.get(actor.state_numpy.remote())
        local_state = dict(local.named_tensors())
        assert set(state) == set(local_state) - {"lm_head.weight"}  # tied copy not shipped
        for name, array in state.items():
            torch.testing.assert_close(torch.tensor(array), local_state[name], atol=1e-6, rtol=0)
    finally:
        torch.set_num_threads(threads)
        ray.kill(actor)
