"""Fixtures of the loongsage-agents tests: the shared tiny model (built once, cached on disk)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny Qwen2 HF folder of ``tests/conftest.py`` (same builder, same cache)."""
    from loongsage.plugin.testing import tiny_model

    return tiny_model()
