"""Fixtures of the loongsage-distill tests: the tiny model and teachers made from it.

A teacher here is a real Hugging Face folder: the tiny Qwen2 with its weights perturbed by a
seeded amount, saved with its tokenizer, so each teacher gives a distinct distribution over
the student's vocabulary (what distillation needs) while sharing its architecture (what a
shared memory slot needs).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny Qwen2 HF folder of ``tests/conftest.py`` (same builder, same cache)."""
    from loongsage.plugin.testing import tiny_model

    return tiny_model()


def perturbed_copy(source: Path, folder: Path, seed: int, scale: float = 0.05, **config) -> Path:
    """``source``'s model with every weight moved by ``scale``·N(0, 1), and ``config`` overrides."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    for key, value in config.items():
        setattr(model.config, key, value)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def make_teacher():
    """``perturbed_copy``, for tests that need a teacher of their own."""
    return perturbed_copy


@pytest.fixture(scope="session")
def teacher_dirs(tiny_model_dir, tmp_path_factory) -> list[Path]:
    """Three teachers of the tiny model's architecture, each a different perturbation."""
    root = tmp_path_factory.mktemp("teachers")
    return [perturbed_copy(tiny_model_dir, root / f"teacher{i}", seed=i + 1) for i in range(3)]
