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


def _teacher_targets(name):
    return getattr(REGISTRIES.kl_policy.entry(name).params, "teacher_targets", "logprobs")


@pytest.mark.parametrize("name", [n for n in REGISTRIES.kl_policy.names() if _teacher_targets(n) == "logprobs"])
def test_kl_policy_is_zero_on_identical_policies_and_keeps_gradient(name):
    logprobs = torch.tensor([[-1.0, -0.5, -3.0]], requires_grad=True)
    value = REGISTRIES.kl_policy.get(name)(logprobs, logprobs.detach().clone())
    assert value.shape == (1, 3) and torch.all(value == 0)
    assert value.requires_grad


@pytest.mark.parametrize("name", [n for n in REGISTRIES.kl_policy.names() if _teacher_targets(n) != "logprobs"])
def test_logit_level_kl_policy_is_zero_on_identical_distributions_and_keeps_gradient(name):
    """``fn(student_logits [c, V], teacher_logprobs, teacher_ids, beta) -> [c]`` (docs/plugins.md):
    the teacher's full log-softmax for ``full`` methods, its top-k (here k = V) for ``topk``."""
    logits = torch.tensor([[2.0, 0.5, -1.0, 0.0], [0.0, 0.0, 1.0, -2.0]], requires_grad=True)
    logprobs = torch.log_softmax(logits.detach(), -1)
    top = logprobs.topk(4, dim=-1)
    teacher = (logprobs, None) if _teacher_targets(name) == "full" else (top.values, top.indices)
    value = REGISTRIES.kl_policy.get(name)(logits, *teacher, 0.5)
    assert value.shape == (2,) and value.abs().max() < 1e-6
    assert value.requires_grad
