"""``loongsage sft`` alone: the warm start trains, and saves a folder usable as model.path."""

from __future__ import annotations

import re
import subprocess

import pytest
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.slow


def test_sft_command_lowers_the_loss_and_saves_a_model(tmp_path, runs):
    args = [*runs.cli, "sft", "--config-name", "tiny/grpo", f"trainer.run_dir={tmp_path}",
            "trainer.sft.steps=20", "logging.progress_bar=false"]
    result = subprocess.run(args, capture_output=True, text=True, env=runs.env(), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    first, last = map(float, re.search(r"loss ([0-9.]+) -> ([0-9.]+) in 20 steps", result.stdout).groups())
    assert last < first / 2
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "sft_model")
    assert model.config.model_type == "qwen2"
