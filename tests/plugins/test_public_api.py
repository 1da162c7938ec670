"""``loongsage.plugin``: the public API is complete, light to import, and its checks can fail."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import loongsage.plugin as plugin
from loongsage.plugin import testing
from loongsage.registry import KINDS

REPO = Path(__file__).resolve().parents[2]


def test_every_public_name_resolves_from_the_module_it_lives_in():
    for name, (module, why) in plugin.PUBLIC.items():
        assert why, name
        value = getattr(plugin, name)
        assert value is getattr(sys.modules[module], name)
    assert set(plugin.__all__) == {"hookimpl", *plugin.PUBLIC}
    with pytest.raises(AttributeError, match="no attribute 'Objective'"):
        plugin.Objective  # noqa: B018 (core's own, not public)


def test_the_names_type_checkers_see_are_the_public_names():
    """The ``if TYPE_CHECKING:`` imports (for editors) list exactly the ``PUBLIC`` table."""
    tree = ast.parse(Path(plugin.__file__).read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    imported = {(node.module, alias.name) for node in block.body for alias in node.names}
    assert imported == {(module, name) for name, (module, _) in plugin.PUBLIC.items()}


def test_importing_hookimpl_from_the_public_api_imports_no_torch():
    """Entry-point modules import ``hookimpl`` from here; ``loongsage plugins`` must stay light."""
    code = ("import sys; from loongsage.plugin import hookimpl, ConfigError, Prompt; "
            "print(sorted(m for m in ('torch', 'transformers', 'ray', 'uvicorn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_kind_has_a_contract_type_and_a_check():
    assert set(plugin.KIND_CONTRACTS) == set(KINDS)
    for kind, name in plugin.KIND_CONTRACTS.items():
        assert isinstance(getattr(plugin, name), type), kind
    assert set(testing.CONTRACT_CHECKS) == set(KINDS)


def test_runtime_checkable_contracts_tell_a_conforming_object_from_another():
    class Listing:
        def get(self, index):
            return None

    assert isinstance(Listing(), plugin.Dataset)
    assert not isinstance(object(), plugin.Dataset)
    assert not isinstance(Listing(), plugin.Agent)


@dataclass
class NoParams:
    pass


def _loss_without_gradient(inputs, params):
    return plugin.PolicyLossOutput(loss=torch.zeros_like(inputs.old_logprobs))


def _kl_not_zero(logprobs, ref_logprobs):
    return (logprobs - ref_logprobs) + 1.0


class _AgentWithSyncRun:
    def __init__(self, params, context):
        pass

    def run_group(self, prompt, n, client, sampling_params):
        return []


@dataclass
class _Section:
    weight: float = 0.0


class _StepTermWithoutBuild:
    section = "probe"
    schema = _Section
    source_schema = None

    def validate(self, cfg, registries):
        return None

    def memory(self, cfg, settings, batch_tokens):
        return ()


def _reward_without_context(sample_text, ground_truth, params):
    return 1.0


def _command_without_registries(argv):
    return 0


@pytest.mark.parametrize("check, obj, message", [
    (testing.check_policy_loss_contract, _loss_without_gradient, "gradient must reach logprobs"),
    (testing.check_kl_policy_contract, _kl_not_zero, "identical policies must be 0"),
    (testing.check_agent_contract, _AgentWithSyncRun, "run_group must be async"),
    (testing.check_step_term_contract, _StepTermWithoutBuild(), "needs build"),
    (testing.check_reward_contract, _reward_without_context, "reward signature"),
    (testing.check_command_contract, _command_without_registries, "main\\(argv, registries\\)"),
])
def test_a_broken_plugin_fails_its_contract_check(check, obj, message):
    params = None if check is not testing.check_kl_policy_contract else "logprobs"
    with pytest.raises(AssertionError, match=message):
        check(obj, params)


def test_check_entry_asks_for_params_an_entry_cannot_default():
    entry = testing.installed_registries().dataset.entry("jsonl")
    with pytest.raises(TypeError, match="dataset 'jsonl' has required parameters"):
        testing.check_entry(entry)


def test_a_distributions_entries_are_listed_and_pass(tmp_path):
    registries = testing.installed_registries()
    algos = list(testing.entries_of(registries, "loongsage-algos"))
    assert algos and {e.distribution for e in algos} == {"loongsage-algos"}
    for entry in algos:
        testing.check_entry(entry)


def test_plugins_md_documents_the_public_api_and_no_internal_module():
    text = (REPO / "docs" / "plugins.md").read_text(encoding="utf-8")
    missing = [name for name in ("hookimpl", *plugin.PUBLIC) if f"| `{name}` |" not in text]
    assert missing == []
    internal = set(re.findall(r"\bloongsage\.(?!plugin\b|train\b)[a-z_]+", text))
    assert internal == set(), f"docs/plugins.md sends authors into core's internals: {sorted(internal)}"
