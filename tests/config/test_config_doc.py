"""``loongsage config show --doc``: the resolved config, one ``key: value`` a line, each key
followed by its description: the comment of its field in the dataclass typing its node (read
from the class's source, so the dataclasses are the one place a key is described): the schema's
sections for core keys, the plugin's parameter dataclass for a plugin node's keys. Every key of
every shipped recipe has one; the values are the resolved config's."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from typing import List

import pytest
from omegaconf import OmegaConf

from loongsage.config.compose import list_recipes, load_config
from loongsage.config.docs import documented_lines, field_comments, plugin_refs
from loongsage.schema import LoraSettings, TrainConfig

# plugin nodes the recipes leave out: a list of IS corrections, filters, a middleware, a window
PLUGIN_OVERRIDES = [
    "algorithm.is_correction=[{name: opsm}, {name: token}]",
    "algorithm.filters=[{name: dynamic_sampling}, {name: overlong}]",
    "data_sources.0.filters=[{name: length}]",
    "agentflow.middlewares=[{name: agent_sessions}]",
    "async/window_policy=window_gated",
]


def _shown(value) -> str:
    if isinstance(value, str):
        return value if "\n" not in value else json.dumps(value)
    return json.dumps(OmegaConf.to_container(value) if OmegaConf.is_config(value) else value)


def test_doc_lines_carry_the_values_and_the_dataclasses_comments():
    done = subprocess.run([sys.executable, "-m", "loongsage.cli", "config", "show", "--config-name", "tiny/grpo",
                           "--doc", "train.lr=0.25"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    cfg = load_config("tiny/grpo", ["train.lr=0.25"]).cfg
    assert "train.lr: 0.25  # AdamW learning rate (constant over the RL steps)" in lines
    assert f"train.micro_batch_size: {cfg.train.micro_batch_size}  # sequences per forward/backward" in lines
    assert ('train.lora.target_modules: ["q_proj", "k_proj", "v_proj", "o_proj"]  # names of the modules that '
            'get adapters (peft matches them against the module names)') in lines
    # a plugin node: its name key says the plugin, its parameters come from the plugin's dataclass
    assert ("data_sources.0.dataset.format: synthetic_math  # dataset plugin: Seeded arithmetic word problems "
            "(add/subtract) with answers in \\boxed{}.") in lines
    assert "data_sources.0.reward.correct_score: 1.0  # boxed answer equal to the ground truth" in lines
    assert ("data_sources.0.reward.timeout_s: 30.0  # deadline of one reward call; past it the worker is "
            "killed") in lines  # a generic key of every reward node (loongsage.schema.RewardOptions)
    assert "algorithm.policy_loss.eps_high: 0.28  # ratio upper bound 1 + eps_high (DAPO clip-higher)" in lines
    # inherited fields (RewardConfig extends RewardOptions) and a class documenting its fields in its docstring
    assert "reward.on_error: zero  # a timed-out or failed call: zero | drop_group | fail" in lines
    assert any(line.startswith("transfer.num_slots: 2  # buckets in flight at once") for line in lines)
    keys = [line.split(": ", 1)[0] for line in lines]
    assert len(keys) == len(set(keys)) > 100
    for line in lines:  # every value is the resolved config's
        key, text = line.split(": ", 1)
        assert text.split("  # ", 1)[0] == _shown(OmegaConf.select(cfg, key)), line


@pytest.mark.parametrize("overrides", [[], PLUGIN_OVERRIDES], ids=["recipe", "more-plugin-nodes"])
def test_a_free_mapping_and_a_text_of_several_lines_stay_on_one_line(overrides):
    run = load_config("tiny/grpo", ["data_sources.0.sampling={temperature: 0.5}", *overrides])
    run.cfg.data_sources[0].system_prompt = "one\ntwo"
    lines = list(documented_lines(run.cfg, plugin_refs(run)))
    assert 'data_sources.0.sampling: {"temperature": 0.5}  # overrides of rollout sampling' in lines
    assert 'data_sources.0.system_prompt: "one\\ntwo"  # sent as the first (system) message of every prompt' in lines
    if overrides:  # a list of plugin nodes is documented entry by entry, each by its own plugin
        assert any(line.startswith("algorithm.is_correction.1.name: token  # is_correction plugin: ") for line in lines)
        assert any(line.startswith("async.window_policy.window: 0  # dispatch window in groups") for line in lines)


@dataclass
class _Base:
    inherited: int = 0  # from the base class


@dataclass
class _Documented(_Base):
    """A class documenting ``from_docstring`` in its docstring.

    from_docstring: said here,
        over two lines.
    """

    trailing: int = 1  # on the field's own line
    # a block above the field,
    # joined into one line
    above: int = 2
    # a block that the trailing comment overrides
    both: int = 3  # the trailing comment wins
    # a block cut off from the field by a blank line

    detached: int = 4
    bare: List[int] = field(default_factory=list)
    from_docstring: int = 5


def test_comments_come_from_the_fields_lines_the_block_above_them_or_the_docstring():
    assert field_comments(_Documented) == {
        "inherited": "from the base class",
        "trailing": "on the field's own line",
        "above": "a block above the field, joined into one line",
        "both": "the trailing comment wins",
        "from_docstring": "said here, over two lines.",
    }  # detached and bare: no description invented
    assert field_comments(TrainConfig)["micro_batch_size"] == "sequences per forward/backward"
    assert field_comments(LoraSettings)["sync"].startswith("adapter (only adapter tensors")


@pytest.mark.parametrize("recipe", list_recipes())
def test_every_key_of_every_shipped_recipe_is_described(recipe):
    """A key without a description names itself and where it is declared: its field in
    ``loongsage.schema`` (core keys) or in the plugin's parameter dataclass (a plugin node's
    keys; ``loongsage config show --group GROUP`` lists the plugin) needs a comment."""
    run = load_config(recipe, [])
    lines = list(documented_lines(run.cfg, plugin_refs(run)))
    assert len(lines) > 100
    undocumented = [line.split(": ", 1)[0] for line in lines if "  # " not in line]
    assert not undocumented, (f"{recipe}: keys without a description (give their dataclass fields a comment): "
                              + ", ".join(undocumented))


def test_keys_of_plugin_nodes_the_recipes_leave_out_are_described():
    run = load_config("tiny/grpo", PLUGIN_OVERRIDES)
    lines = list(documented_lines(run.cfg, plugin_refs(run)))
    undocumented = [line.split(": ", 1)[0] for line in lines if "  # " not in line]
    assert not undocumented, "keys without a description: " + ", ".join(undocumented)
