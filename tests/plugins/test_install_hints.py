"""Every install command LoongSage prints works: the distributions are not on a package index,
so no message may say ``pip install loongsage-X`` (or an extra of one); a sibling's hint builds
the wheels in a clone (``.ci/wheels`` runs the m2po hint's command and trains with it) and an
extra's hint installs the extra's own requirements, read from the installed metadata."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from loongsage.catalogue import install_hint
from loongsage.install_hints import distribution_command, extra_command

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted(REPO.glob("loongsage-*/src/**/*.py"))


def test_no_source_prints_a_pip_install_of_a_loongsage_distribution():
    assert len(SOURCES) > 100
    index_installs = re.compile(r"pip install ['\"]?loongsage-")
    offenders = [f"{path.relative_to(REPO)}:{n}" for path in SOURCES
                 for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if index_installs.search(line)]
    assert offenders == []


def test_a_sibling_hint_builds_the_wheels_in_a_clone():
    assert distribution_command("loongsage-algos") == ("in a clone of LoongSage: make wheels && "
                                                       "pip install dist/loongsage_algos-*.whl")
    makefile = (REPO / "Makefile").read_text()
    assert "\nwheels:" in makefile and "-w dist" in makefile


@pytest.mark.parametrize("distribution,extra", [("loongsage-core", "tensorboard"), ("loongsage-core", "wandb"),
                                                ("loongsage-core", "mlflow"), ("loongsage-core", "lora"),
                                                ("loongsage-agents", "huggingface")])
def test_an_extra_hint_installs_the_extras_requirements(distribution, extra):
    pyproject = tomllib.loads((REPO / distribution / "pyproject.toml").read_text())
    wanted = pyproject["project"]["optional-dependencies"][extra]
    assert extra_command(distribution, extra) == "pip install " + " ".join(f"'{req}'" for req in wanted)


def test_a_missing_sibling_plugin_names_the_working_command(monkeypatch):
    from loongsage import catalogue

    monkeypatch.setattr(catalogue, "is_installed", lambda distribution: False)
    assert install_hint("policy_loss", "m2po").endswith(
        "which is not installed; in a clone of LoongSage: make wheels && pip install dist/loongsage_algos-*.whl")
