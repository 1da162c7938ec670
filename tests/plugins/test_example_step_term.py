"""The example package's ``entropy_bonus`` step term trains through core's real training step.

The example's own tests check the term's contract and its loss on hand-made tensors; this one
names the package's plugin module from the recipe (as a run does), lets core validate the
``entropy_bonus`` section and build the extension, and runs ``TrainStep`` with the embedded
train engine on the tiny model in this process: with every reward equal (zero advantages) the
only gradient is the bonus's, so the policy's entropy on the batch's loss tokens must rise.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from loongsage.algorithms.objective import Objective
from loongsage.config.compose import load_config
from loongsage.config.validate import as_container
from loongsage.controller.placement import Seat
from loongsage.controller.step_extension import start_step_extension
from loongsage.controller.train_step import TrainStep
from loongsage.engines.batch import TrainBatch
from loongsage.engines.distributed import RankShards
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.errors import ConfigError
from loongsage.plugins import clear_cache
from loongsage.schema import ModelConfig, TrainConfig

EXAMPLE_SRC = Path(__file__).resolve().parents[2] / "examples" / "loongsage-example-plugin" / "src"
PLUGIN = "plugins=[loongsage_example_plugin.plugin]"


@pytest.fixture
def example_on_path(tmp_path, monkeypatch):
    """The package's sources alone on sys.path (not its build's egg-info, whose entry point
    would register it a second time beside the recipe's ``plugins:``)."""
    shutil.copytree(EXAMPLE_SRC / "loongsage_example_plugin", tmp_path / "loongsage_example_plugin",
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.syspath_prepend(str(tmp_path))


def _load(*overrides):
    try:
        return load_config("tiny/grpo", [PLUGIN, *overrides])
    finally:
        clear_cache()


def _mean_entropy(engine, batch) -> float:
    entropy = engine.compute_logprobs(batch, with_entropy=True)["entropy"]
    return float((entropy * batch.loss_mask).sum() / batch.loss_mask.sum())


def test_the_section_is_validated_and_off_at_its_default(example_on_path):
    assert _load().step_terms == ()
    assert [term.settings for term in _load("entropy_bonus.coef=0.5").step_terms] == [0.5]
    with pytest.raises(ConfigError, match=r"^entropy_bonus.coef: must be >= 0"):
        _load("entropy_bonus.coef=-1")


def test_the_entropy_bonus_raises_the_policys_entropy_through_the_train_step(example_on_path, tiny_model_dir):
    spec = _load("entropy_bonus.coef=1.0")
    seat = Seat("train", 0, "", 0, 0, 0, threads=1)
    extension = start_step_extension(spec.step_terms[0], as_container(spec.cfg), seat)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 500, (4, 16), generator=g)
    mask = torch.zeros(4, 16)
    mask[:, 8:] = 1.0
    batch = TrainBatch(ids, torch.ones(4, 16, dtype=torch.long), mask, {"rollout_logprobs": torch.zeros(4, 16)})
    engine = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)), TrainConfig(lr=1e-3, micro_batch_size=4),
                                 device="cpu")
    before = _mean_entropy(engine, batch)
    step = TrainStep(Objective(spec.algorithm, extension.train_term))
    shards = RankShards([torch.arange(4)], [torch.zeros(4, dtype=torch.bool)], 1)
    for _ in range(3):
        metrics, _ = step(engine, (batch, torch.ones(4), torch.tensor([0, 0, 1, 1])), shards, keep_rows=[0])
    assert metrics["train/pg_loss"] == 0 and metrics["train/entropy_bonus"] > 6  # the tiny model's entropy
    assert metrics["train/loss"] == pytest.approx(-metrics["train/entropy_bonus"])  # the term's share joined
    assert _mean_entropy(engine, batch) > before + 0.02, (before, _mean_entropy(engine, batch))
