"""SAO's strict double-sided mask on π_θ/π_roll: values and gradients by hand, no π_old in the
ratio, finite at ±1000 log-ratios, refused beside a π_old/π_roll IS correction."""

import math

import pytest
import torch

from loongsage.algorithms.objective import Objective
from loongsage.plugin.testing import check_policy_loss_contract, loss_context
from loongsage.plugin import PolicyLossInputs
from loongsage.plugin import ConfigError
from loongsage.plugin.testing import installed_registries
from loongsage_algos.losses.sao import sao_loss
from loongsage_algos.params import SAOParams

D = torch.float64


def _inputs(roll_log_ratio, adv, old_shift=0.0):
    """log π_θ − log π_roll = ``roll_log_ratio``; π_old shifted away to show it is not used."""
    ratio = torch.tensor(roll_log_ratio, dtype=D)
    roll = torch.full_like(ratio, -1.0)
    logprobs = (roll + ratio).requires_grad_()
    old = roll + old_shift
    adv = torch.tensor(adv, dtype=D)
    return PolicyLossInputs(logprobs, old, roll, adv, torch.ones_like(adv))


def test_tokens_outside_the_band_are_dropped_and_inside_keep_the_ratio_gradient():
    # r = e^x: 0.7 and 1.35 fall outside [0.8, 1.3]; 1.0 and 1.2 inside (ε_low 0.2, ε_high 0.3)
    x = [[math.log(0.7), 0.0, math.log(1.2), math.log(1.35)]]
    adv = [[1.0, 2.0, -1.0, 1.0]]
    inp = _inputs(x, adv, old_shift=5.0)  # π_old far away: a π_old ratio would mask everything
    out = sao_loss(inp, SAOParams(eps_low=0.2, eps_high=0.3))
    assert out.keep.tolist() == [[0.0, 1.0, 1.0, 0.0]]
    assert out.loss.detach()[0].tolist() == pytest.approx([0.0, -2.0, 1.2, 0.0])
    out.loss.sum().backward()
    # d(−r·Â)/d log π_θ = −r·Â on kept tokens, 0 on dropped ones (PPO-clip would keep 0.7's)
    assert inp.logprobs.grad[0].tolist() == pytest.approx([0.0, -2.0, 1.2, 0.0])


def test_band_edges_are_inside():
    inp = _inputs([[math.log(0.8) + 1e-9, math.log(1.3) - 1e-9]], [[1.0, 1.0]])
    assert sao_loss(inp, SAOParams(eps_low=0.2, eps_high=0.3)).keep.tolist() == [[1.0, 1.0]]


def test_extreme_log_ratios_give_a_finite_objective_and_gradient():
    objective = Objective.from_config({"policy_loss": "sao"}, installed_registries())
    n, length = 3, 5
    lp = torch.full((n, length), -1.0)
    roll = lp.clone()
    lp[0, 1:3] += 1000.0
    lp[1] -= 1000.0
    roll[2, 4] -= 1000.0
    mask = torch.ones(n, length)
    adv = torch.tensor([1.0, -1.0, 1.0])[:, None].expand(n, length).contiguous()
    lp.requires_grad_()
    ctx = loss_context(lp, mask, {"old_logprobs": lp.detach().clone(), "rollout_logprobs": roll,
                                  "advantages": adv})
    loss, metrics = objective(ctx)
    loss.backward()
    assert math.isfinite(float(loss.detach())) and all(math.isfinite(v) for v in metrics.values())
    assert torch.isfinite(lp.grad).all()
    assert metrics["train/sao_maskfrac"] == pytest.approx(8 / 15)  # 2 + 5 + 1 extreme tokens


def test_refused_beside_an_is_correction_by_the_same_mismatch():
    with pytest.raises(ConfigError, match="sao"):
        Objective.from_config({"policy_loss": "sao", "is_correction": "token"}, installed_registries())


def test_contract():
    check_policy_loss_contract(sao_loss, SAOParams())
