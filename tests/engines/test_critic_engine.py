"""The embedded critic on the tiny Qwen2: values aligned with log-probs, the clipped value
loss by hand, learning fixed returns, checkpoints that keep the head, frozen attention, and
taking over a warm-started policy's body."""

from __future__ import annotations

import pytest
import torch

from loongsage.engines.batch import TrainBatch
from loongsage.plugins import get_registries
from loongsage.schema import ModelConfig, TrainConfig
from loongsage_algos.critic.config import CriticConfig
from loongsage_algos.critic.engine import EmbeddedCriticEngine, clipped_value_loss


def make_critic(path, **critic) -> EmbeddedCriticEngine:
    return EmbeddedCriticEngine(ModelConfig(path=str(path)), TrainConfig(micro_batch_size=3),
                                CriticConfig(**critic), device="cpu")


def batch(n=4, length=16, seed=0) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 500, (n, length), generator=g)
    attn = torch.ones(n, length, dtype=torch.long)
    attn[0, -4:] = 0  # a padded row
    mask = torch.zeros(n, length)
    mask[:, 6:] = 1.0
    mask[0, -4:] = 0.0
    mask[1, 9:11] = 0.0  # an observation inside the response
    return TrainBatch(ids, attn, mask)


def test_registered_as_engine():
    assert get_registries().engine.get("embedded_critic") is EmbeddedCriticEngine


def test_clipped_value_loss_by_hand():
    values, old, returns = torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0.0, 0.0, 0.4]), torch.tensor([2.0, 1.0, 0.0])
    loss, clipped = clipped_value_loss(values, old, returns, clip=0.2)
    # row 0: V moved 1.0 > 0.2: clipped V 0.2, (0.2−2)² = 3.24 > (1−2)² = 1 -> 1.62, clipped term active
    # row 1: unchanged V: ½·1 = 0.5; row 2: moved 0.1 inside the clip: ½·0.25
    assert loss.tolist() == pytest.approx([1.62, 0.5, 0.125])
    assert clipped.tolist() == [1.0, 0.0, 0.0]


def test_values_sit_where_logprobs_sit(tiny_model_dir):
    critic = make_critic(tiny_model_dir)
    b = batch()
    values = critic.compute_values(b)
    assert values.shape == b.input_ids.shape and values[:, 1:].std() > 0  # a random head, not a constant
    head = critic.model.get_submodule("value_head")
    assert float(head.bias.detach()) == 0.0 and 0.01 < float(head.weight.detach().std()) < 0.03  # N(0, 0.02²)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(0.5)
    values = critic.compute_values(b)
    assert torch.all(values[:, 0] == 0) and torch.all(values[0, -4:] == 0)  # position 0 and padding
    assert torch.all(values[0, 1:-4] == 0.5) and torch.all(values[1:, 1:] == 0.5)


def test_learns_fixed_returns_and_saves_its_head(tiny_model_dir, tmp_path):
    critic = make_critic(tiny_model_dir, lr=3e-3, value_clip=10.0)
    b = batch()
    returns = torch.linspace(-1.0, 1.0, b.input_ids.shape[0])[:, None] * b.loss_mask
    first = None
    for _ in range(25):
        old = critic.compute_values(b)
        metrics = critic.train_values(b, returns, old, mini_batches=2)
        first = metrics["critic/value_loss"] if first is None else first
    assert metrics["critic/value_loss"] < 0.2 * first
    values = critic.compute_values(b)
    critic.save(tmp_path / "critic")
    again = make_critic(tmp_path / "critic")
    assert torch.allclose(again.compute_values(b), values, atol=1e-6)
    again.load(tmp_path / "critic")  # resume: weights, head and optimizer state
    assert torch.allclose(again.compute_values(b), values, atol=1e-6)


def test_frozen_attention_layers_do_not_move(tiny_model_dir):
    critic = make_critic(tiny_model_dir, lr=1e-2, freeze_attention=True)
    before = {k: v.clone() for k, v in critic.model.state_dict().items()}
    b = batch()
    returns = torch.ones_like(b.loss_mask) * b.loss_mask
    critic.train_values(b, returns, critic.compute_values(b))
    after = critic.model.state_dict()
    attention = [k for k in before if ".self_attn." in k]
    assert attention and all(torch.equal(before[k], after[k]) for k in attention)
    assert any(not torch.equal(before[k], after[k]) for k in before if ".mlp." in k)


def test_load_body_takes_a_policy_and_keeps_the_head(tiny_model_dir, tmp_path):
    from loongsage.engines.embedded_train import EmbeddedTrainEngine

    policy = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)), TrainConfig(), device="cpu")
    with torch.no_grad():
        for param in policy.model.parameters():
            param.add_(0.01)
    policy.save(tmp_path / "policy")
    critic = make_critic(tiny_model_dir)
    with torch.no_grad():
        critic.model.get_submodule("value_head").bias.fill_(0.25)
    critic.load_body(tmp_path / "policy")
    body = {k: v for k, v in critic.model.state_dict().items() if not k.startswith("value_head.")}
    assert all(torch.equal(v, policy.model.state_dict()[k]) for k, v in body.items())
    assert float(critic.model.get_submodule("value_head").bias.detach()) == 0.25
