"""A third-party plugin registering one entry per algorithm hook, used through the same paths.

Each hook is exercised for real: the entries go through ``load_plugins``, the validator and
the objective / ``compute_advantages`` / ``FilterChain`` exactly as built-ins do.
"""

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from loongsage import hookimpl
from loongsage.algorithms.advantages import compute_advantages
from loongsage.algorithms.filters import FilterChain, FilterResult
from loongsage.algorithms.objective import Objective
from loongsage.plugin.testing import check_policy_loss_contract, loss_context
from loongsage.algorithms.types import Correction, PolicyLossOutput
from loongsage.algorithms.validate import validate_algorithm
from loongsage.data.types import Group, Prompt, Sample
from loongsage.errors import ConfigError
from loongsage.plugins import load_plugins


@dataclass
class ScaledParams:
    """Scale the advantage by a constant."""

    scale: float = 2.0


@dataclass
class HalfParams:
    """A correction that halves every weight and uses π_old/π_roll."""

    uses_rollout_ratio: ClassVar[bool] = True


def scaled_pg(inputs, params):
    """−scale·Â·log π_θ."""
    return PolicyLossOutput(loss=-params.scale * inputs.advantages * inputs.logprobs)


def raw_reward(inputs, params):
    """Â = r."""
    return inputs.rewards.unsqueeze(-1) * inputs.mask


def half(inputs, params):
    """Weight ½."""
    return Correction(weight=torch.full_like(inputs.mask, 0.5))


def squared(logprobs, ref_logprobs):
    """(log π_θ − log π_ref)²."""
    return (logprobs - ref_logprobs) ** 2


def keep_first(groups, params):
    """Keep only the first group."""
    return FilterResult(groups[:1], {"rollout/custom_drop": float(len(groups) - 1)})


class ThirdParty:
    @hookimpl
    def loongsage_register_policy_losses(register):
        register("scaled_pg", scaled_pg, params=ScaledParams)

    @hookimpl
    def loongsage_register_advantage_estimators(register):
        register("raw_reward", raw_reward)

    @hookimpl
    def loongsage_register_is_corrections(register):
        register("half", half, params=HalfParams)

    @hookimpl
    def loongsage_register_kl_policies(register):
        register("squared", squared)

    @hookimpl
    def loongsage_register_data_filters(register):
        register("keep_first", keep_first)


@pytest.fixture(scope="module")
def registries():
    return load_plugins(extra=[(ThirdParty, "third_party_algos")])


@pytest.mark.calls_hook("loongsage_register_policy_losses", "loongsage_register_is_corrections",
                        "loongsage_register_kl_policies")
def test_custom_loss_correction_and_kl_compose_in_the_objective(registries):
    check_policy_loss_contract(scaled_pg, ScaledParams())
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    extras = {"old_logprobs": logprobs.detach(), "rollout_logprobs": logprobs.detach(),
              "advantages": torch.tensor([[1.0, 1.0]]), "ref_logprobs": torch.tensor([[-1.5, -2.0]])}
    obj = Objective.from_config({"policy_loss": {"name": "scaled_pg", "scale": 3.0}, "is_correction": "half",
                                 "kl": {"method": "squared", "coef": 0.1}}, registries)
    loss, _ = obj(loss_context(logprobs, torch.ones(1, 2), extras))
    # PG: −3·1·(−1 − 2)/2 · ½ ; KL: 0.1 · (0.25 + 0)/2
    assert loss.item() == pytest.approx(2.25 + 0.0125)


def test_custom_correction_flag_is_enforced_against_m2po(registries):
    if "m2po" not in registries.policy_loss:
        pytest.skip("loongsage-algos is not installed")
    with pytest.raises(ConfigError, match="corrected twice"):
        validate_algorithm({"policy_loss": "m2po", "is_correction": "half"}, registries)


@pytest.mark.calls_hook("loongsage_register_advantage_estimators", "loongsage_register_data_filters")
def test_custom_advantage_and_filter(registries):
    adv = compute_advantages([0.5, 2.0], [0, 0], torch.ones(2, 3), validate_algorithm({"advantage_estimator": "raw_reward"}, registries))
    assert adv.tolist() == [[0.5] * 3, [2.0] * 3]
    sample = Sample([1], [2], [-0.1], [0], [1])
    groups = [Group(i, Prompt("s", i, []), [sample]) for i in range(3)]
    out = FilterChain(registries.resolve_all("data_filter", ["keep_first"], "algorithm.filters"))(groups)
    assert [g.group_id for g in out.groups] == [0] and out.metrics == {"rollout/custom_drop": 2.0}
