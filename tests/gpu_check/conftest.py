"""The GPU check's helpers live in ``benchmarks/`` (scripts, not a package): load them by path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="session")
def bench():
    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"gpu_check_bench_{name}", BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    return load
