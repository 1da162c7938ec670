"""The objective end to end on core built-ins: composition by hand, split invariance, metrics."""

import math
import pickle

import pytest
import torch

from loongsage.algorithms.aggregation import AGG_MODES
from loongsage.algorithms.metrics import sum_metrics
from loongsage.algorithms.objective import Objective
from loongsage.plugin.testing import loss_context, split_and_sum
from loongsage.plugins import get_registries


def _batch(seed=0, n=6, length=5):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(n, length, generator=g) > 0.3).double()
    mask[0] = 0.0  # a row without loss tokens
    mask[1, 2] = 1.0
    old = -torch.rand(n, length, generator=g, dtype=torch.float64) * 2
    extras = {
        "old_logprobs": old,
        "rollout_logprobs": old + 0.1 * torch.randn(n, length, generator=g, dtype=torch.float64),
        "advantages": torch.randn(n, 1, generator=g, dtype=torch.float64).expand(n, length) * mask,
        "ref_logprobs": old + 0.2 * torch.randn(n, length, generator=g, dtype=torch.float64),
    }
    logprobs = old + 0.3 * torch.randn(n, length, generator=g, dtype=torch.float64)
    return logprobs, mask, extras


def _objective(mode="token_mean", **algo):
    cfg = {"policy_loss": {"name": "ppo_clip"}, "loss_agg_mode": mode,
           "kl": {"method": "k2", "coef": 0.05, "use_as": "loss"}, **algo}
    return Objective.from_config(cfg, get_registries())


def test_composition_by_hand():
    """Two tokens, token_mean: L = mean(PPO term) + β·mean(k2)."""
    old = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    logprobs = torch.tensor([[-0.9, -2.5]], dtype=torch.float64, requires_grad=True)
    roll = torch.tensor([[-1.1, -2.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -2.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -2.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.float64)
    ctx = loss_context(logprobs, mask, {"old_logprobs": old, "rollout_logprobs": roll,
                                        "advantages": adv, "ref_logprobs": ref})
    loss, metrics = _objective()(ctx)
    r1, r2 = math.exp(0.1), math.exp(-0.5)  # ratios
    pg1 = -r1 * 1.0  # inside [0.8, 1.28]
    pg2 = max(-r2 * -2.0, -0.8 * -2.0)  # Â < 0, ρ below 1 - eps_low: clipped term 1.6 wins
    kl1, kl2 = 0.5 * (0.6 ** 2), 0.5 * (0.5 ** 2)
    expected = (pg1 + pg2) / 2 + 0.05 * (kl1 + kl2) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert metrics["train/loss"] == pytest.approx(expected, rel=1e-12)
    assert metrics["train/pg_loss"] == pytest.approx((pg1 + pg2) / 2, rel=1e-12)
    assert metrics["train/kl_loss"] == pytest.approx((kl1 + kl2) / 2, rel=1e-12)
    assert metrics["train/pg_clipfrac"] == pytest.approx(0.5)
    d = 0.1  # old - roll on token 1, 0 on token 2
    assert metrics["train/is_approx_k3_kl"] == pytest.approx((math.exp(d) - d - 1) / 2, rel=1e-9)
    assert metrics["train/is_logprob_abs_diff"] == pytest.approx(0.1 / 2, rel=1e-9)
    loss.backward()
    assert logprobs.grad[0, 0].item() == pytest.approx((-r1 * 1.0 + 0.05 * 0.6) / 2, rel=1e-9)
    assert logprobs.grad[0, 1].item() == pytest.approx((0.05 * -0.5) / 2, rel=1e-9)  # PG term clipped


@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batch_split_invariance(mode):
    logprobs, mask, extras = _batch()
    objective = _objective(mode)
    leaf_full = logprobs.clone().requires_grad_()
    full, full_metrics = objective(loss_context(leaf_full, mask, extras))
    full.backward()
    leaf_split = logprobs.clone().requires_grad_()
    split, split_metrics = split_and_sum(objective, leaf_split, mask, extras, [0, 1, 4, 5, 6])
    split.backward()
    assert split.item() == pytest.approx(full.item(), rel=1e-12, abs=1e-14)
    torch.testing.assert_close(leaf_split.grad, leaf_full.grad)
    for key, value in full_metrics.items():
        assert split_metrics[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_mismatch_metrics_are_zero_when_logprobs_coincide():
    logprobs, mask, extras = _batch()
    extras["rollout_logprobs"] = extras["old_logprobs"].clone()
    _, metrics = _objective()(loss_context(logprobs, mask, extras))
    assert metrics["train/is_approx_k3_kl"] == 0.0
    assert metrics["train/is_logprob_abs_diff"] == 0.0


def test_kl_off_needs_no_reference_and_kl_reward_adds_no_loss_term():
    logprobs, mask, extras = _batch()
    extras.pop("ref_logprobs")
    for kl in ({"method": "k3", "coef": 0.0}, {"method": "k1", "coef": 0.1, "use_as": "reward"}):
        objective = Objective.from_config({"kl": kl}, get_registries())
        _, metrics = objective(loss_context(logprobs, mask, extras))
        assert "train/kl_loss" not in metrics
        assert metrics["train/loss"] == pytest.approx(metrics["train/pg_loss"])
    assert not Objective.from_config({"kl": {"coef": 0.0}}, get_registries()).needs_reference
    assert Objective.from_config({"kl": {"coef": 0.1}}, get_registries()).needs_reference


def test_missing_extras_are_named():
    logprobs, mask, extras = _batch()
    extras.pop("ref_logprobs")
    with pytest.raises(KeyError, match="ref_logprobs"):
        _objective()(loss_context(logprobs, mask, extras))


def test_picklable_and_identical_after_round_trip():
    logprobs, mask, extras = _batch()
    objective = _objective("seq_mean_token_mean")
    clone = pickle.loads(pickle.dumps(objective))
    a, _ = objective(loss_context(logprobs, mask, extras))
    b, _ = clone(loss_context(logprobs, mask, extras))
    assert a.item() == b.item()


def test_sum_metrics_adds_shares():
    assert sum_metrics([{"a": 1.0, "b": 2.0}, {"a": 0.5}]) == {"a": 1.5, "b": 2.0}
