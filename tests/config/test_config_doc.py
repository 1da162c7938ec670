"""``loongsage config show --doc``: the resolved config, one ``key: value`` a line, each key
whose schema field carries a comment followed by that comment (read from the schema's source,
so the schema is the one place a key is described); the values are the resolved config's."""

from __future__ import annotations

import json
import subprocess
import sys

from omegaconf import OmegaConf

from loongsage.config.compose import load_config
from loongsage.config.docs import field_comments
from loongsage.schema import LoraSettings, TrainConfig


def test_doc_lines_carry_the_values_and_the_schemas_comments():
    done = subprocess.run([sys.executable, "-m", "loongsage.cli", "config", "show", "--config-name", "tiny/grpo",
                           "--doc", "train.lr=0.25"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    cfg = load_config("tiny/grpo", ["train.lr=0.25"]).cfg
    assert "train.lr: 0.25  # AdamW learning rate (constant over the RL steps)" in lines
    assert f"train.micro_batch_size: {cfg.train.micro_batch_size}  # sequences per forward/backward" in lines
    assert 'train.lora.target_modules: ["q_proj", "k_proj", "v_proj", "o_proj"]' in lines
    assert "data_sources.0.dataset.format: synthetic_math" in lines
    keys = [line.split(": ", 1)[0] for line in lines]
    assert len(keys) == len(set(keys)) > 100
    for line in lines:  # every value is the resolved config's
        key, text = line.split(": ", 1)
        value = OmegaConf.select(cfg, key)
        shown = text.split("  # ", 1)[0]
        assert shown == (value if isinstance(value, str) else
                         json.dumps(OmegaConf.to_container(value) if OmegaConf.is_config(value) else value)), line


def test_comments_come_from_the_fields_own_lines():
    comments = field_comments(TrainConfig)
    assert comments["micro_batch_size"] == "sequences per forward/backward"
    assert field_comments(LoraSettings)["sync"].startswith("adapter (only adapter tensors")
