"""``loongsage.plugin.testing``: the checks our own plugins pass, for third-party plugins too.

- Contract checks, one per kind (``CONTRACT_CHECKS``), and ``check_entry(entry)`` to run the
  right one on a registry entry with its default parameters; ``entries_of(registries,
  distribution)`` lists what a distribution registered.
- Algorithm helpers: ``loss_context`` and ``split_and_sum`` build what a train engine hands
  a loss closure.
- Registries and a model for tests: ``installed_registries``, ``registries_with``,
  ``tiny_model``.

A plugin distribution's test of its whole registration is three lines::

    from loongsage.plugin.testing import check_entry, entries_of, installed_registries

    def test_contracts():
        for entry in entries_of(installed_registries(), "my-distribution"):
            check_entry(entry)
"""

from loongsage.plugin.testing.algorithms import (
    check_advantage_contract,
    check_correction_contract,
    check_kl_policy_contract,
    check_policy_loss_contract,
    loss_context,
    split_and_sum,
)
from loongsage.plugin.testing.contracts import (
    CONTRACT_CHECKS,
    check_agent_contract,
    check_command_contract,
    check_data_filter_contract,
    check_dataset_contract,
    check_engine_contract,
    check_entry,
    check_environment_contract,
    check_reward_contract,
    check_router_middleware_contract,
    check_sandbox_contract,
    check_step_term_contract,
    check_tool_parser_contract,
    check_tracker_contract,
    check_window_policy_contract,
    default_params,
    entries_of,
)
from loongsage.plugin.testing.harness import installed_registries, registries_with, tiny_model

__all__ = [
    "CONTRACT_CHECKS",
    "check_advantage_contract",
    "check_agent_contract",
    "check_command_contract",
    "check_correction_contract",
    "check_data_filter_contract",
    "check_dataset_contract",
    "check_engine_contract",
    "check_entry",
    "check_environment_contract",
    "check_kl_policy_contract",
    "check_policy_loss_contract",
    "check_reward_contract",
    "check_router_middleware_contract",
    "check_sandbox_contract",
    "check_step_term_contract",
    "check_tool_parser_contract",
    "check_tracker_contract",
    "check_window_policy_contract",
    "default_params",
    "entries_of",
    "installed_registries",
    "loss_context",
    "registries_with",
    "split_and_sum",
    "tiny_model",
]
