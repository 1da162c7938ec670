"""Shared fixtures: the tiny test model, built once and cached by content hash.

Torch runs single-threaded in the test process (override with LOONGSAGE_TEST_THREADS): on a
shared 2-core machine, 2 OpenMP threads made a 15-step tiny SFT run 52 s instead of 3.9 s
(spin-waiting under contention), while on an idle machine the tiny model barely gains.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    import torch

    torch.set_num_threads(int(os.environ.get("LOONGSAGE_TEST_THREADS", "1")))


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """A tiny Qwen2 HF folder (≈3.3 M params, local BPE tokenizer, ChatML template).

    Built deterministically into ``$LOONGSAGE_CACHE`` (default ``~/.cache/loongsage``) under
    a hash of its recipe, so sessions reuse it; treat it as read-only.
    """
    from loongsage.models.tiny import ensure_tiny_model

    return ensure_tiny_model()
