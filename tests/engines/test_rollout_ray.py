"""The embedded rollout engine hosted in a real Ray actor and built from a LoongSage config:
it serves HTTP from the actor, and weights sent as numpy arrays (Ray's fast path) take effect."""

from __future__ import annotations

import os

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from loongsage.schema import ModelConfig, RolloutConfig
from loongsage.engines.client import EngineClient
from loongsage.engines.embedded_rollout import EmbeddedRolloutEngine
from loongsage.plugins import get_registries

PROMPT = [4, 8, 15, 16, 23, 42]


def test_from_config_reads_model_and_rollout_sections(tiny_model_dir):
    cfg = OmegaConf.create({
        "model": OmegaConf.structured(ModelConfig(path=str(tiny_model_dir))),
        "rollout": OmegaConf.structured(RolloutConfig(max_running_requests=3, num_threads=1)),
    })
    eng = EmbeddedRolloutEngine.from_config(cfg)
    assert eng.scheduler.max_running == 3 and eng.model_path == str(tiny_model_dir)
    assert get_registries().engine.entry("embedded_rollout").target.endswith(":EmbeddedRolloutEngine")
    with pytest.raises(ValueError, match="model.path"):
        EmbeddedRolloutEngine.from_config({"model": {}, "rollout": {}})


@pytest.mark.slow
def test_engine_serves_from_a_ray_actor(tiny_model_dir):
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=1 << 30)
    actor = ray.remote(EmbeddedRolloutEngine).options(num_cpus=1).remote(
        str(tiny_model_dir), num_threads=1)
    try:
        client = EngineClient(ray.get(actor.start.remote()), timeout=60)
        greedy = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
        before = client.generate(PROMPT, greedy)
        new = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
        with torch.no_grad():
            for p in new.parameters():
                p.mul_(1.5)
        state = {n: t.detach().numpy() for n, t in new.named_parameters()}
        assert ray.get(actor.apply_weights.remote(state, 3)) == 3
        after = client.generate(PROMPT, greedy)
        with torch.no_grad():
            lp = new(torch.tensor([PROMPT + after.output_ids])).logits.log_softmax(-1)[0]
        ref = torch.stack([lp[len(PROMPT) - 1 + i, t] for i, t in enumerate(after.output_ids)])
        assert after.weight_version == 3 and before.weight_version == 0
        assert torch.allclose(torch.tensor(after.output_logprobs), ref, atol=1e-5, rtol=0)
        ray.get(actor.stop.remote())
        assert client.health() is False
    finally:
        ray.kill(actor)
        if started:
            ray.shutdown()
