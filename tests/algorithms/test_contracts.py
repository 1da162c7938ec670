"""Contract checks over every registered algorithm entry (built-ins and installed plugins)."""

import pytest
import torch

from loongsage.algorithms.testing import (
    check_advantage_contract,
    check_correction_contract,
    check_policy_loss_contract,
)
from loongsage.plugins import get_registries

REGISTRIES = get_registries()


def _params(entry):
    return entry.build_params({}, f"test.{entry.kind}")


@pytest.mark.parametrize("name", REGISTRIES.policy_loss.names())
def test_policy_loss_contract(name):
    entry = REGISTRIES.policy_loss.entry(name)
    check_policy_loss_contract(entry.obj, _params(entry))


@pytest.mark.parametrize("name", REGISTRIES.is_correction.names())
def test_is_correction_contract(name):
    entry = REGISTRIES.is_correction.entry(name)
    check_correction_contract(entry.obj, _params(entry))


@pytest.mark.parametrize("name", REGISTRIES.advantage.names())
def test_advantage_contract(name):
    entry = REGISTRIES.advantage.entry(name)
    check_advantage_contract(entry.obj, _params(entry))


@pytest.mark.parametrize("name", REGISTRIES.kl_policy.names())
def test_kl_policy_is_zero_on_identical_policies_and_keeps_gradient(name):
    logprobs = torch.tensor([[-1.0, -0.5, -3.0]], requires_grad=True)
    value = REGISTRIES.kl_policy.get(name)(logprobs, logprobs.detach().clone())
    assert value.shape == (1, 3) and torch.all(value == 0)
    assert value.requires_grad
