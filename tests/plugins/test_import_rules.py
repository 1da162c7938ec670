"""The import rules of ``pyproject.toml``'s ``[tool.importlinter]`` hold, and would catch a break.

``lint-imports`` (import-linter, a dev requirement) checks them statically in about a second:
plugin distributions import nothing of core but ``loongsage.plugin``, never each other; core
never imports them; core's packages keep the layers of docs/architecture.md, whose import-rules
block must list the same layers. The planted cases run the same contracts over a throwaway
plugin package (or a copy of core with one import added), so the check is shown to fail on
exactly the import it forbids.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_SRC = REPO / "examples" / "loongsage-example-plugin" / "src"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]


def lint_imports(*args: str, pythonpath: tuple[Path, ...] = ()) -> subprocess.CompletedProcess:
    assert LINT_IMPORTS.exists(), f"{LINT_IMPORTS} is missing: pip install -r requirements-dev.txt"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, (EXAMPLE_SRC, *pythonpath)), env.get("PYTHONPATH", "")])
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_import_rules_hold():
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    for contract in CONFIG["contracts"]:
        assert f"{contract['name']} KEPT" in result.stdout


def test_architecture_md_lists_the_layers_the_contract_checks():
    layers = next(c for c in CONFIG["contracts"] if c["type"] == "layers")["layers"]
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"```text\n# import rules: layers of loongsage, top to bottom\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md lost its import-rules block"
    assert block.group(1).splitlines() == layers


def _toml(value) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return "[" + ", ".join(_toml(v) for v in value) + "]"


def _write_config(path: Path, config: dict) -> None:
    lines = ["[tool.importlinter]"]
    lines += [f"{k} = {_toml(v)}" for k, v in config.items() if k != "contracts"]
    for contract in config["contracts"]:
        lines += ["", "[[tool.importlinter.contracts]]", *(f"{k} = {_toml(v)}" for k, v in contract.items())]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.mark.parametrize("plugin_source, broken, needle", [
    ("from loongsage.plugin import hookimpl\nfrom loongsage.engines.pool import EnginePool\n",
     "Plugin distributions import only loongsage.plugin", "loongsage_planted.plugin -> loongsage.engines.pool"),
    ("from loongsage.plugin import hookimpl\nfrom loongsage_algos.advantages import rloo_advantage\n",
     "Plugin distributions never import each other", "loongsage_planted.plugin -> loongsage_algos.advantages"),
    ("from loongsage.plugin import hookimpl, Prompt\nfrom loongsage.plugin.testing import check_entry\n",
     None, None),
])
def test_a_planted_plugin_package_is_judged_by_the_same_contracts(tmp_path, plugin_source, broken, needle):
    package = tmp_path / "loongsage_planted"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "plugin.py").write_text(plugin_source)
    config = dict(CONFIG, root_packages=[*CONFIG["root_packages"], "loongsage_planted"])
    config["contracts"] = []
    for contract in CONFIG["contracts"]:  # the planted package joins the plugin distributions
        planted = dict(contract)
        for key in ("source_modules", "modules", "ignore_imports"):
            ours = [v.replace("loongsage_algos", "loongsage_planted") for v in contract.get(key, ())
                    if v.startswith("loongsage_algos")]
            if ours:
                planted[key] = [*contract[key], *ours]
        config["contracts"].append(planted)
    _write_config(tmp_path / "planted.toml", config)
    result = lint_imports("--config", str(tmp_path / "planted.toml"), pythonpath=(tmp_path,))
    if broken is None:
        assert result.returncode == 0, result.stdout + result.stderr
    else:
        assert result.returncode == 1, result.stdout + result.stderr
        assert f"{broken} BROKEN" in result.stdout and needle in result.stdout
        assert f"Contracts: {len(CONFIG['contracts']) - 1} kept, 1 broken." in result.stdout


def test_megatron_importing_the_embedded_trainer_breaks_the_engines_contract(tmp_path):
    """A copy of core in which the Megatron engine imports the embedded trainer: one contract
    breaks, naming that import (the engines meet only in engines' shared modules)."""
    shutil.copytree(REPO / "loongsage-core" / "src" / "loongsage", tmp_path / "loongsage",
                    ignore=shutil.ignore_patterns("__pycache__"))
    model = tmp_path / "loongsage" / "engines" / "megatron" / "model.py"
    model.write_text(model.read_text(encoding="utf-8") + "\nfrom loongsage.engines.embedded_train import load_causal_lm\n",
                     encoding="utf-8")
    result = lint_imports(pythonpath=(tmp_path,))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "engines: Megatron imports no other engine BROKEN" in result.stdout
    assert "loongsage.engines.megatron.model -> loongsage.engines.embedded_train" in result.stdout
    assert f"Contracts: {len(CONFIG['contracts']) - 1} kept, 1 broken." in result.stdout
