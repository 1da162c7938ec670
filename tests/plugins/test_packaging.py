"""The wheels work alone: every runtime import is a declared dependency, and each built wheel
carries its README, the Apache-2.0 LICENSE, ``py.typed``, classifiers, project URLs and (core)
the recipes and the install hints' catalogue; siblings pin a compatible loongsage-core range.
``.ci/wheels`` then installs the wheels into a clean venv outside the repository and trains
from them."""

from __future__ import annotations

import ast
import email
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from loongsage.config.compose import list_recipes

REPO = Path(__file__).resolve().parents[2]
DISTRIBUTIONS = {
    "loongsage-core": "loongsage",
    "loongsage-algos": "loongsage_algos",
    "loongsage-agents": "loongsage_agents",
    "loongsage-distill": "loongsage_distill",
    "loongsage-sandbox": "loongsage_sandbox",
}


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """Top-level modules imported at module level, and inside functions (lazily)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    eager, lazy = set(), set()

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            names = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = [child.module]
            (lazy if inner else eager).update(n.split(".")[0] for n in names)
            visit(child, inner)

    visit(tree, False)
    return eager, lazy


def _provided(distribution: str) -> tuple[set[str], set[str]]:
    """Top-level modules of the distribution's declared dependencies (its pyproject.toml, the
    source of truth) and of its extras' dependencies, as the installed packages provide them."""
    project = tomllib.loads((REPO / distribution / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    modules_of: dict[str, set[str]] = {}
    for module, dists in metadata.packages_distributions().items():
        for dist in dists:
            modules_of.setdefault(dist.lower().replace("_", "-"), set()).add(module)

    def modules(requirements: list[str]) -> set[str]:
        names = {Requirement(r).name.lower().replace("_", "-") for r in requirements}
        return {m for name in names for m in modules_of.get(name, set())}

    extras = [r for group in project.get("optional-dependencies", {}).values() for r in group]
    return modules(project.get("dependencies", [])), modules(extras)


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_every_runtime_import_is_a_declared_dependency(distribution):
    package = DISTRIBUTIONS[distribution]
    base, extras = _provided(distribution)
    own = {package} | {DISTRIBUTIONS["loongsage-core"]}
    ignore = set(sys.stdlib_module_names) | own | {"__future__"}
    missing = []
    for path in sorted((REPO / distribution / "src" / package).rglob("*.py")):
        eager, lazy = _imports(path)
        for module in sorted(eager - ignore - base):
            missing.append(f"{path.relative_to(REPO)} imports {module} (not a dependency)")
        for module in sorted(lazy - ignore - base - extras):
            missing.append(f"{path.relative_to(REPO)} imports {module} lazily (not even an extra)")
    assert not missing, "\n".join(missing)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, zipfile.ZipFile]:
    out, sources = tmp_path_factory.mktemp("wheels"), tmp_path_factory.mktemp("sources")
    for dist in DISTRIBUTIONS:  # a copy, so setuptools' build/ folder stays out of the checkout
        shutil.copytree(REPO / dist, sources / dist, ignore=shutil.ignore_patterns(
            "build", "*.egg-info", "__pycache__", "tests"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(out), *(str(sources / d) for d in DISTRIBUTIONS)], check=True, timeout=600)
    found = {}
    for wheel in out.glob("*.whl"):
        name = wheel.name.split("-")[0].replace("_", "-")
        found[name] = zipfile.ZipFile(wheel)
    assert set(found) == set(DISTRIBUTIONS)
    return found


def _metadata(wheel: zipfile.ZipFile) -> email.message.Message:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    return email.message_from_string(wheel.read(name).decode("utf-8"))


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_wheel_carries_readme_license_types_and_metadata(wheels, distribution):
    wheel = wheels[distribution]
    names = wheel.namelist()
    meta = _metadata(wheel)
    license_file = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
    assert wheel.read(license_file) == (REPO / "LICENSE").read_bytes()
    assert b"Apache License" in wheel.read(license_file) and b"TERMS AND CONDITIONS" in wheel.read(license_file)
    assert meta["License-Expression"] == "Apache-2.0"
    assert f"{DISTRIBUTIONS[distribution]}/py.typed" in names
    readme = (REPO / distribution / "README.md").read_text(encoding="utf-8")
    assert meta.get_payload().strip() == readme.strip() and meta["Description-Content-Type"] == "text/markdown"
    assert "Typing :: Typed" in meta.get_all("Classifier") and len(meta.get_all("Classifier")) >= 5
    assert {u.split(",")[0] for u in meta.get_all("Project-URL")} >= {"Homepage", "Repository", "Issues"}
    if distribution != "loongsage-core":
        [core] = [Requirement(r) for r in meta.get_all("Requires-Dist") if r.startswith("loongsage-core")]
        assert "0.1.0" in core.specifier and "0.2.0" not in core.specifier, core


def test_core_wheel_ships_every_recipe(wheels):
    names = set(wheels["loongsage-core"].namelist())
    recipes = {n.removeprefix("loongsage/recipes/").removesuffix(".yaml")
               for n in names if n.startswith("loongsage/recipes/")}
    assert recipes == set(list_recipes()) and {"tiny/grpo", "smollm2/grpo", "production/qwen3_4b_dapo"} <= recipes


def test_core_wheel_ships_the_install_hints_catalogue(wheels):
    """The hints for a sibling that is not installed read loongsage/sibling_plugins.json (package data)."""
    shipped = wheels["loongsage-core"].read("loongsage/sibling_plugins.json")
    assert shipped == (REPO / "loongsage-core" / "src" / "loongsage" / "sibling_plugins.json").read_bytes()


def test_transformers_floor_is_one_the_engines_run_on():
    """Every distribution that needs transformers asks for one floor, and it is 5.24 or later:
    both embedded engines pass their KV cache as ``cache=`` and read it back as ``.cache``,
    the names 5.24 gave what was ``past_key_values``, so an older release would install and
    then fail in the first rollout or shared-prompt train step."""
    floors = {}
    for distribution in DISTRIBUTIONS:
        project = tomllib.loads((REPO / distribution / "pyproject.toml").read_text(encoding="utf-8"))
        for line in project["project"].get("dependencies", []):
            requirement = Requirement(line)
            if requirement.name == "transformers":
                floors[distribution] = {s.version for s in requirement.specifier if s.operator == ">="}
    assert "loongsage-core" in floors and len({frozenset(f) for f in floors.values()}) == 1, floors
    (floor,) = floors["loongsage-core"]
    assert tuple(int(part) for part in floor.split(".")[:2]) >= (5, 24), floor
