"""Contract tests, parametrised over every registered entry of every kind.

Whatever distribution registered an entry, it must honour its kind's contract
(docs/plugins.md §4). The checks are ``loongsage.plugin.testing``'s, which third-party
authors run on their own plugins; advantage estimators, policy losses, IS corrections and KL
policies are checked in ``tests/algorithms/test_contracts.py``, every other kind here.
"""

from __future__ import annotations

import pytest
from tool_guard import optional_skip

from loongsage.plugin.testing import CONTRACT_CHECKS, default_params, installed_registries
from loongsage.registry import KINDS

REGISTRIES = installed_registries()
ALGORITHM_KINDS = ("advantage", "policy_loss", "is_correction", "kl_policy")


def entries(kind: str):
    return [pytest.param(e, id=e.name) for e in REGISTRIES[kind]]


def test_every_kind_has_at_least_one_entry():
    assert [k for k in KINDS if len(REGISTRIES[k]) == 0] == []


def test_every_kind_has_a_contract_check():
    assert set(CONTRACT_CHECKS) == set(KINDS)


@pytest.mark.parametrize(
    "entry", [p for kind in KINDS if kind not in ALGORITHM_KINDS for p in entries(kind)],
    ids=lambda e: f"{e.kind}:{e.name}",
)
def test_entry_honours_its_kinds_contract(entry):
    params = default_params(entry)
    if params is None and entry.params is not None:
        optional_skip(f"{entry.kind} '{entry.name}' needs settings of its own (a file, a server); its own "
                      "tests configure it")
    CONTRACT_CHECKS[entry.kind](entry.obj, params)


def test_the_step_term_contract_checks_nested_sections_and_supplies():
    """A section one level inside a core section passes (loongsage-algos' ``algorithm.critic``);
    a deeper one, or ``supplies`` given as one string instead of a tuple of keys, is caught."""
    from dataclasses import make_dataclass

    from loongsage.plugin.testing import check_step_term_contract

    class Term:
        section, schema, source_schema, supplies = "algorithm.critic", make_dataclass("S", []), None, ("values",)

        def validate(self, cfg, registries): ...

        def memory(self, cfg, settings, batch_tokens): ...

        def build(self, context): ...

    check_step_term_contract(Term(), None)
    for attribute, value, message in [("section", "a.b.c", "section name"), ("supplies", "values", "tuple")]:
        term = Term()
        setattr(term, attribute, value)
        with pytest.raises(AssertionError, match=message):
            check_step_term_contract(term, None)
