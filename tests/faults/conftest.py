"""Fault-injection tests reuse the end-to-end helpers (``runs``: the real CLI in a subprocess
with its own Ray cluster) from ``tests/e2e/conftest.py``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("e2e_helpers", Path(__file__).parent.parent / "e2e" / "conftest.py")
e2e_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(e2e_helpers)
runs = e2e_helpers.runs
