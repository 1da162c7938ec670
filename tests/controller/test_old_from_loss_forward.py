"""π_old from the loss forward: one optimizer step needs no separate no-grad forward.

Two engines load the same tiny Qwen2 and take one step on the same batch: one through
``TrainStep`` (which takes π_old, detached, from the loss forward when the objective
allows it), one through the old sequence (no-grad ``compute_logprobs``, advantages, prepare,
``train_step``). The weights after the step, the metrics and the π_old kept for the saved
samples agree, and the fused side ran no ``compute_logprobs`` at all. Where π_old is read
before the loss (M2PO's batch mask, a KL penalty in the reward) or the step has several
mini-batches, the forward still runs.
"""

from __future__ import annotations

import pytest
import torch

from loongsage.algorithms.advantages import compute_advantages
from loongsage.algorithms.objective import Objective
from loongsage.controller.train_step import TrainStep
from loongsage.engines.batch import TrainBatch
from loongsage.engines.distributed import RankShards
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.plugins import get_registries
from loongsage.schema import ModelConfig, TrainConfig


class CountingEngine(EmbeddedTrainEngine):
    """The embedded engine, counting its no-grad π_old forwards."""

    old_forwards = 0

    def compute_logprobs(self, *args, **kwargs):
        self.old_forwards += 1
        return super().compute_logprobs(*args, **kwargs)


def engine(path) -> CountingEngine:
    return CountingEngine(ModelConfig(path=str(path)), TrainConfig(lr=1e-3, micro_batch_size=3), device="cpu")


def rollout_batch(n=6, length=18) -> tuple[TrainBatch, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 500, (n, length), generator=g)
    attn = torch.ones(n, length, dtype=torch.long)
    mask = torch.zeros(n, length)
    for row in range(n):
        end = length - row
        attn[row, end:] = 0
        mask[row, 6:end] = 1.0
    roll = -torch.rand(n, length, generator=g) * 3 * mask
    batch = TrainBatch(ids, attn, mask, {"rollout_logprobs": roll})
    return batch, torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 0, 1, 1, 1])


def objective(**algo) -> Objective:
    cfg = {"policy_loss": {"name": "ppo_clip"}, "kl": {"method": "k3", "coef": 0.0}, **algo}
    return Objective.from_config(cfg, get_registries())


def one_rank(rows: int, mini_batches: int = 1) -> RankShards:
    return RankShards([torch.arange(rows)], [torch.zeros(rows, dtype=torch.bool)], mini_batches)


def recompute_then_train(eng: EmbeddedTrainEngine, data, obj: Objective) -> tuple[dict, torch.Tensor]:
    """The sequence before this change: a no-grad π_old forward, then the optimizer step."""
    batch, rewards, groups = data
    batch.extras["old_logprobs"] = eng.compute_logprobs(batch)["logprobs"]
    batch.extras["advantages"] = compute_advantages(rewards, groups, batch.loss_mask, obj.spec,
                                                    old_logprobs=batch.extras["old_logprobs"])
    obj.prepare(batch)
    return eng.train_step(batch, obj), batch.extras["old_logprobs"]


def test_one_step_without_the_old_forward_matches_the_recomputed_step(tiny_model_dir):
    fused, baseline = engine(tiny_model_dir), engine(tiny_model_dir)
    obj = objective()
    assert obj.old_from_loss_forward(1) and not obj.old_from_loss_forward(2)
    initial = {name: tensor.clone() for name, tensor in fused.model.state_dict().items()}
    batch, rewards, groups = rollout_batch()
    metrics, kept = TrainStep(obj)(fused, (batch, rewards, groups), one_rank(len(batch)), keep_rows=[0, 4])
    expected, old = recompute_then_train(baseline, rollout_batch(), obj)

    assert fused.old_forwards == 0 and baseline.old_forwards == 1
    torch.testing.assert_close(kept["train_logprobs"], old[[0, 4]], atol=1e-6, rtol=0)
    assert torch.equal(kept["advantages"], batch.extras["advantages"][[0, 4]])
    torch.testing.assert_close(batch.extras["old_logprobs"], old, atol=1e-6, rtol=0)
    for key in ("train/loss", "train/pg_loss", "train/is_approx_k3_kl", "train/is_logprob_abs_diff",
                "train/grad_norm"):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-8), key
    assert metrics["train/is_approx_k3_kl"] > 0  # the rollout logprobs really differ from π_old
    after, recomputed = fused.model.state_dict(), baseline.model.state_dict()
    for name, tensor in after.items():
        torch.testing.assert_close(tensor, recomputed[name], atol=1e-6, rtol=0)
    assert max(float((after[name] - initial[name]).abs().max()) for name in after) > 1e-4  # it moved


@pytest.mark.parametrize("case", ["m2po_batch_mask", "kl_in_reward", "two_mini_batches"])
def test_the_old_forward_still_runs_where_pi_old_is_read_first(tiny_model_dir, case):
    algo = {
        "m2po_batch_mask": {"policy_loss": {"name": "m2po"}},
        "kl_in_reward": {"kl": {"method": "k1", "coef": 0.1, "use_as": "reward"}},
        "two_mini_batches": {},
    }[case]
    mini_batches = 2 if case == "two_mini_batches" else 1
    obj = objective(**algo)
    assert not obj.old_from_loss_forward(mini_batches)
    eng = engine(tiny_model_dir)
    batch, rewards, groups = rollout_batch()
    metrics, kept = TrainStep(obj)(eng, (batch, rewards, groups), one_rank(len(batch), mini_batches),
                                   keep_rows=[1])
    assert eng.old_forwards == 1 and kept["train_logprobs"].shape == (1, batch.input_ids.shape[1])
    assert metrics["train/optimizer_steps"] == mini_batches


def test_old_from_forward_refuses_several_mini_batches(tiny_model_dir):
    eng = engine(tiny_model_dir)
    batch, _, _ = rollout_batch()
    batch.extras["advantages"] = torch.zeros_like(batch.loss_mask)
    with pytest.raises(ValueError, match="one optimizer step, got 2 mini-batches"):
        eng.train_step(batch, objective(), mini_batches=2, old_from_forward=True)
