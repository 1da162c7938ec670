"""Shared fixtures: the tiny test model, built once and cached by content hash."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """A tiny Qwen2 HF folder (≈3.3 M params, local BPE tokenizer, ChatML template).

    Built deterministically into ``$LOONGSAGE_CACHE`` (default ``~/.cache/loongsage``) under
    a hash of its recipe, so sessions reuse it; treat it as read-only.
    """
    from loongsage.models.tiny import ensure_tiny_model

    return ensure_tiny_model()
