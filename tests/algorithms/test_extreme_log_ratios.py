"""Every policy loss with every IS correction stays finite on log-ratios of ±1000.

A stale or mismatched token can have log π_θ − log π_old or log π_old − log π_roll far past
the float32 range of exp (88.7). Each loss clamps its log-ratio; a sequence-level weight sums
the clamped per-token values, so a few extreme tokens overflow it, and a masked weight then
must be selected away, not multiplied by zero (inf · 0 = NaN). Objective-level test: the
loss, every metric and the gradient of log π_θ must be finite, in float32 as trained.
"""

from __future__ import annotations

import math

import pytest
import torch

from loongsage.algorithms.objective import Objective
from loongsage.plugin.testing import loss_context
from loongsage.errors import ConfigError
from loongsage.plugins import get_registries

REGISTRIES = get_registries()
CORRECTIONS = [
    None,
    *[
        {"name": level, "action": action, "lower": 0.5, "upper": 2.0}
        for level in ("token", "sequence", "geometric")
        for action in ("clip", "mask")
    ],
    {"name": "sequence", "action": "clip", "upper": 2.0},  # one-sided TIS (no lower bound)
    "icepop",
    "opsm",
]
HUGE = 1000.0


def _extreme_batch():
    """Rows: π_θ ≫ π_old with π_old ≪ π_roll; the reverse; one token π_old ≫ π_roll; on policy."""
    n, length = 4, 6
    lp = torch.full((n, length), -1.0)
    old, roll = lp.clone(), lp.clone()
    old[0, 1:3] -= HUGE  # log π_θ − log π_old = +1000, log π_old − log π_roll = −1000
    lp[1, :] -= HUGE  # log π_θ − log π_old = −1000
    roll[1, :] -= (
        HUGE  # log π_old − log π_roll = +1000 on six tokens: clamped to 20, Σ = 120 > 88.7
    )
    roll[2, 3] -= HUGE
    mask = torch.ones(n, length)
    mask[3, 4:] = 0.0
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])[:, None].expand(n, length) * mask
    extras = {"old_logprobs": old, "rollout_logprobs": roll, "advantages": adv.contiguous()}
    return lp.requires_grad_(), mask, extras


def _valid_objectives() -> list:
    """Every registered policy loss with every correction validation accepts (M2PO corrects
    the mismatch itself and is refused together with an IS weight)."""
    out = []
    for loss in REGISTRIES.policy_loss.names():
        for correction in CORRECTIONS:
            name = correction
            if isinstance(correction, dict):
                sides = "two-sided" if "lower" in correction else "one-sided"
                name = f"{correction['name']}-{correction['action']}-{sides}"
            try:
                objective = Objective.from_config(
                    {"policy_loss": loss, "is_correction": correction}, REGISTRIES
                )
            except ConfigError:
                continue
            out.append(pytest.param(objective, id=f"{loss}-{name}"))
    return out


@pytest.mark.parametrize("objective", _valid_objectives())
def test_loss_metrics_and_gradient_are_finite(objective):
    logprobs, mask, extras = _extreme_batch()
    ctx = loss_context(logprobs, mask, extras)
    objective.prepare(ctx.batch)
    loss, metrics = objective(ctx)
    assert torch.isfinite(loss), f"loss {loss.item()}"
    assert {k: v for k, v in metrics.items() if not math.isfinite(v)} == {}
    loss.backward()
    assert torch.isfinite(logprobs.grad).all()


def test_sequence_mask_drops_the_overflowing_sequence_and_keeps_the_rest():
    """The masked sequence (Σ log π_old/π_roll = 4000) gets weight 0, on-policy rows weight 1."""
    from loongsage.algorithms.types import PolicyLossInputs
    from loongsage_algos.is_corrections import sequence_is
    from loongsage_algos.params import ISParams

    logprobs, mask, extras = _extreme_batch()
    inputs = PolicyLossInputs(
        logprobs, extras["old_logprobs"], extras["rollout_logprobs"], extras["advantages"], mask
    )
    out = sequence_is(inputs, ISParams(action="mask", lower=0.5, upper=2.0))
    assert out.keep[:, 0].tolist() == [0.0, 0.0, 0.0, 1.0]
    assert out.weight[:, 0].tolist() == [0.0, 0.0, 0.0, 1.0]
