"""Core's catalogue of sibling plugins (``sibling_plugins.json``) is exactly what the installed
siblings register: it is generated from their registrations (``tests/sibling_catalogue.py``),
and a sibling registering a name the shipped file lacks fails here until ``make catalogue``."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sibling_catalogue import REPO, TARGET, collect, render, siblings

from loongsage import catalogue
from loongsage.catalogue import install_hint, provider
from loongsage.plugins import load_plugins


@pytest.fixture(scope="module")
def installed():
    """Every installed distribution's plugins, autoload on (the test venv holds all five)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("LOONGSAGE_DISABLE_PLUGIN_AUTOLOAD", raising=False)
        patch.delenv("LOONGSAGE_LOAD_PLUGINS", raising=False)
        return load_plugins()


def test_the_shipped_catalogue_is_what_the_installed_siblings_register(installed):
    assert siblings() == ["loongsage-agents", "loongsage-algos", "loongsage-distill", "loongsage-sandbox"]
    generated = render(collect(installed, siblings()))
    assert TARGET.read_text(encoding="utf-8") == generated, "sibling_plugins.json is stale: run make catalogue"
    assert catalogue.shipped() == json.loads(generated)["providers"]  # what the hints read
    counts = {d: sum(map(len, kinds.values())) for d, kinds in catalogue.shipped().items()}
    assert counts == {"loongsage-agents": 21, "loongsage-algos": 21, "loongsage-distill": 6,
                      "loongsage-sandbox": 5}


def test_a_sibling_registering_a_new_name_makes_the_shipped_catalogue_stale(installed):
    grown = installed.unfrozen_copy()
    grown.policy_loss.add("brand_new_loss", "loongsage_algos.policy_losses:cispo_loss", "loongsage-algos")
    assert render(collect(grown, siblings())) != TARGET.read_text(encoding="utf-8")
    assert provider("policy_loss", "brand_new_loss") is None  # no hint until the file is refreshed


def test_core_names_and_unknown_names_have_no_provider():
    assert (
        provider("policy_loss", "ppo_clip") is None
        and install_hint("policy_loss", "ppo_clip") == ""
    )
    assert provider("policy_loss", "no_such_loss") is None
    assert provider("agent", "m2po") is None  # a name belongs to its kind
    assert provider("policy_loss", "m2po") == "loongsage-algos"


def test_core_code_spells_no_sibling_plugin_name_of_the_catalogue():
    """The names live in the generated file only: no string of loongsage/catalogue.py is one."""
    names = {n for kinds in catalogue.shipped().values() for group in kinds.values() for n in group}
    tree = ast.parse(Path(catalogue.__file__).read_text(encoding="utf-8"))
    strings = {node.value for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert len(names) == 53 and not strings & names


def test_the_generator_refuses_a_partial_load_and_leaves_the_file_alone():
    before = TARGET.read_bytes()
    result = subprocess.run([sys.executable, str(REPO / "tests" / "sibling_catalogue.py")],
                            env={**os.environ, "LOONGSAGE_LOAD_PLUGINS": "loongsage_algos"},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stdout == ""
    assert "unset ['LOONGSAGE_LOAD_PLUGINS']" in result.stderr
    assert TARGET.read_bytes() == before
