"""Shared fixtures: the tiny test model, built once and cached by content hash.

OpenMP threads sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE``, inherited by Ray
workers and subprocesses started by tests): on a shared 2-core machine a 15-step tiny SFT
run took 49 s with spinning threads, 2.4 s passive (3.9 s single-threaded).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads its OpenMP runtime


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """A tiny Qwen2 HF folder (≈3.3 M params, local BPE tokenizer, ChatML template).

    Built deterministically into ``$LOONGSAGE_CACHE`` (default ``~/.cache/loongsage``) under
    a hash of its recipe, so sessions reuse it; treat it as read-only.
    """
    from loongsage.models.tiny import ensure_tiny_model

    return ensure_tiny_model()
