"""What a critic step reports and what a step keeps for the saved samples.

``value_metrics``: the explained variance by hand, and 0 (not ±1e14) when every return of
the step is the same value, which GAE's float32 R = Â + V leaves with a std near 1e-8.
``attach_rows``: the per-token results of a batch (the critic's values, advantages) come
back one entry per response token of each sample, for a sample continued across a weight
update (two versions) and one with an observation span, in a batch padded to another row's
length; the real tiny critic's values there equal those of each sample alone.
"""

from __future__ import annotations

import math

import pytest
import torch

from loongsage.algorithms.advantages import advantage_inputs, compute_advantages
from loongsage.algorithms.gae import gae_returns
from loongsage.algorithms.validate import validate_algorithm
from loongsage.controller.batching import attach_rows, groups_to_batch
from loongsage.data.types import Group, Prompt, Sample
from loongsage.engines.batch import TrainBatch
from loongsage.plugins import get_registries
from loongsage.schema import ModelConfig, TrainConfig
from loongsage_algos.critic.config import CriticConfig
from loongsage_algos.critic.engine import EmbeddedCriticEngine
from loongsage_algos.critic.extension import value_metrics


def gae_spec():
    return validate_algorithm({"advantage_estimator": {"name": "gae", "gamma": 1.0, "lam": 1.0}},
                              get_registries())


def test_explained_variance_by_hand():
    mask = torch.ones(1, 4)
    returns = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    assert value_metrics(returns, returns, mask)["critic/explained_variance"] == pytest.approx(1.0)
    # R − V = [0, 0, 1, 0]: Var 0.25 (Bessel); Var(R) = 5/3
    values = torch.tensor([[0.0, 1.0, 1.0, 3.0]])
    assert value_metrics(values, returns, mask)["critic/explained_variance"] == pytest.approx(1 - 0.25 / (5 / 3))


@pytest.mark.parametrize("reward", [0.0, 1.0])
def test_explained_variance_is_zero_when_every_return_is_the_same(reward):
    spec = gae_spec()
    mask = torch.zeros(8, 40)
    mask[:, 5:35] = 1.0
    mask[2, 12:15] = 0.0  # an observation
    values = torch.randn(8, 40, generator=torch.Generator().manual_seed(0)) * 0.4
    inputs = advantage_inputs(torch.full((8,), reward), torch.arange(8), mask, spec, values=values)
    returns = gae_returns(inputs, spec.advantage.params)
    spread = float(returns[mask > 0].double().std())
    assert 0 < spread < 1e-6  # one value up to float32 rounding, not exactly
    metrics = value_metrics(values, returns, mask)
    assert metrics["critic/explained_variance"] == 0.0
    assert metrics["critic/return_mean"] == pytest.approx(reward, abs=1e-6)
    assert all(math.isfinite(v) for v in metrics.values())


def _sample(prompt: list[int], response: list[int], versions: list[int], mask: list[int], reward: float) -> Sample:
    return Sample(prompt_ids=prompt, response_ids=response, response_logprobs=[-1.0] * len(response),
                  weight_versions=versions, loss_mask=mask, reward=reward)


def test_a_continued_sample_gets_one_value_and_advantage_per_response_token(tiny_model_dir):
    continued = _sample([5, 6, 7], [11, 12, 13, 14, 15, 16], [1, 1, 1, 2, 2, 2], [1] * 6, reward=1.0)
    tool = _sample([5, 6, 7, 8, 9], [21, 22, 23, 24, 25, 26, 27, 28], [2] * 8, [1, 1, 0, 0, 0, 1, 1, 1], reward=0.0)
    short = _sample([5, 6], [31, 32, 33], [2] * 3, [1] * 3, reward=0.5)
    groups = [Group(0, Prompt("math", 0, []), [continued, short]), Group(1, Prompt("math", 1, []), [tool])]
    batch, rewards, group_index = groups_to_batch(groups, pad_id=0)
    critic = EmbeddedCriticEngine(ModelConfig(path=str(tiny_model_dir)), TrainConfig(micro_batch_size=2),
                                  CriticConfig(), device="cpu")
    values = critic.compute_values(batch)
    spec = gae_spec()
    advantages = compute_advantages(rewards, group_index, batch.loss_mask, spec, values=values)
    samples = [continued, short, tool]
    attach_rows(samples, {"values": values, "advantages": advantages})

    for sample in samples:
        n = len(sample.response_ids)
        assert len(sample.values) == len(sample.advantages) == n
        ids = torch.tensor([sample.prompt_ids + sample.response_ids])
        alone = critic.compute_values(TrainBatch(ids, torch.ones_like(ids), torch.ones(ids.shape)))
        assert sample.values == pytest.approx(alone[0, len(sample.prompt_ids):].tolist(), abs=1e-5)
        assert all(a == 0.0 for a, m in zip(sample.advantages, sample.loss_mask) if not m)
        assert all(a != 0.0 for a, m in zip(sample.advantages, sample.loss_mask) if m)
    # γ = λ = 1: Â_t = r − V_t on every loss token, whitened over the batch's loss tokens
    raw = [(s.reward - v) for s in samples for v, m in zip(s.values, s.loss_mask) if m]
    mean, std = torch.tensor(raw).mean(), torch.tensor(raw).std()
    kept = [a for s in samples for a, m in zip(s.advantages, s.loss_mask) if m]
    assert kept == pytest.approx(((torch.tensor(raw) - mean) / std).tolist(), abs=1e-4)


def test_attach_rows_refuses_unknown_fields_and_row_counts():
    sample = _sample([1], [2, 3], [0, 0], [1, 1], 0.0)
    with pytest.raises(ValueError, match=r"\['rollout_logprobs'\] are not per-token sample fields"):
        attach_rows([sample], {"rollout_logprobs": torch.zeros(1, 3)})
    with pytest.raises(ValueError, match="values has 2 rows for 1 samples"):
        attach_rows([sample], {"values": torch.zeros(2, 3)})
