"""The single_turn agent against a real embedded rollout engine over HTTP (tiny model)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from loongsage.engines.client import EngineClient
from loongsage.engines.embedded_rollout.engine import EmbeddedRolloutEngine
from loongsage.plugin import EngineError, SourceContext
from loongsage.plugin.testing import installed_registries
from loongsage_agents.datasets.params import SyntheticMathParams
from loongsage_agents.datasets.synthetic_math import SyntheticMathDataset


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    engine = EmbeddedRolloutEngine(str(tiny_model_dir), seed=0, num_threads=1, weight_version=3)
    engine.start()
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def agent(engine):
    registries = installed_registries()
    cls = registries.agent.get("single_turn")
    return cls(None, SourceContext("arith", "data_sources[0]", engine.tokenizer, registries))


def reference_logprobs(model, prompt_ids, response_ids):
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response_ids)[:, None])[:, 0]


def test_run_group_returns_aligned_samples(engine, agent, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompt = SyntheticMathDataset(SyntheticMathParams(size=10), seed=0).get(4)
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 8}
    with EngineClient(engine.url) as client:
        samples = asyncio.run(agent.run_group(prompt, 3, client, params))
    assert len(samples) == 3
    text = engine.tokenizer.decode(samples[0].prompt_ids)
    assert text == f"<|im_start|>user\n{prompt.messages[0]['content']}<|im_end|>\n<|im_start|>assistant\n"
    for sample in samples:
        n = len(sample.response_ids)
        assert 1 <= n <= 8
        assert sample.finish_reason in ("stop", "length") and (sample.finish_reason == "length") == (n == 8)
        assert sample.loss_mask == [1] * n
        assert sample.weight_versions == [3] * n
        assert sample.text == engine.tokenizer.decode(sample.response_ids, skip_special_tokens=True)
        expected = reference_logprobs(model, sample.prompt_ids, sample.response_ids)
        assert torch.allclose(torch.tensor(sample.response_logprobs), expected, atol=1e-4)


def test_engine_error_propagates_with_its_field(engine, agent):
    prompt = SyntheticMathDataset(SyntheticMathParams(size=10), seed=0).get(0)
    with EngineClient(engine.url) as client, pytest.raises(EngineError, match="max_new_tokens"):
        asyncio.run(agent.run_group(prompt, 2, client, {"max_new_tokens": -5}))
    with pytest.raises(ValueError, match="n must be >= 1"):
        asyncio.run(agent.run_group(prompt, 0, None, {}))
