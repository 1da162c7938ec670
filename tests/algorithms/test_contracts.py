"""Contract checks over every registered algorithm entry (built-ins and installed plugins)."""

import pytest

from loongsage.plugin.testing import (
    check_advantage_contract,
    check_correction_contract,
    check_kl_policy_contract,
    check_policy_loss_contract,
    installed_registries,
)

REGISTRIES = installed_registries()


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
def test_kl_policy_is_zero_on_identical_distributions_and_keeps_gradient(name):
    """Token-level ``fn(logprobs, ref_logprobs) -> [N, L]`` and logit-level
    ``fn(student_logits [c, V], teacher_logprobs, teacher_ids, beta) -> [c]`` (docs/plugins.md),
    by the policy's own ``kl_targets``."""
    entry = REGISTRIES.kl_policy.entry(name)
    check_kl_policy_contract(entry.obj, getattr(entry.params, "kl_targets", "logprobs"))
