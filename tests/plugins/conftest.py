"""Fixtures for plugin tests: fresh registries with run-time plugins, and the example package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loongsage.plugins import clear_cache, load_plugins

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "loongsage-example-plugin"


@pytest.fixture
def registries_with():
    """``registries_with(plugin, ...)``: registries loaded with extra run-time plugins.

    Each call builds its own plugin manager, so nothing registered here outlives the test.
    """

    def build(*plugins: object):
        return load_plugins(extra=[(p, f"runtime_plugin_{i}") for i, p in enumerate(plugins)])

    yield build
    clear_cache()


@pytest.fixture(scope="session")
def example_plugin_path(tmp_path_factory) -> Path:
    """The example third-party package, installed with pip into a private target folder.

    A real wheel build and install with its own entry point; the folder goes on
    PYTHONPATH of the subprocesses that should see it, so the test venv stays untouched.
    """
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(EXAMPLE)],
        check=True,
    )
    return target
