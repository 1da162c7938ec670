"""The megatron engine on several ranks over gloo: TP=2, PP=2 and DP=2 against one process.

Real Ray actors (``EngineHost``), joined by the controller's ``TrainGroup.connect`` into one
torch process group that Megatron carves into TP / PP / DP groups; the step runs through
the controller's own path (``plan_shards`` -> ``groups_to_batch`` -> ``TrainGroup.train`` ->
``TrainStep``, GRPO). The reference is the embedded engine in this process, on the
same rows. Log-probs must agree within 1e-5 on every rank; after one GRPO step (two
mini-batches, micro-batches of 3) the exported HF weights within 1e-5, with ``train.eps`` 1
and no clipping so a mis-scaled gradient (a TP rank double-counted, a DP share missing, the
tied embedding's two stages not summed) moves them far beyond that. The reported loss and
gradient norm must match too.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest

pytest.importorskip("megatron.core")

from loongsage.algorithms.objective import Objective
from loongsage.controller.actors import EngineHost
from loongsage.controller.batching import groups_to_batch, plan_shards
from loongsage.controller.train_group import TrainGroup
from loongsage.controller.train_step import TrainStep
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.engines.megatron.engine import MegatronTrainEngine
from loongsage.plugins import get_registries
from loongsage.schema import ModelConfig, TrainConfig

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

TRAIN = {"lr": 0.1, "eps": 1.0, "micro_batch_size": 3, "grad_clip": 0.0, "num_threads": 1}


@contextmanager
def megatron_group(model_dir, tp: int, pp: int, dp: int):
    cfg = {"model": {"path": str(model_dir)},
           "train": {**TRAIN, "backend": "megatron", "dp_size": dp, "megatron": {"tp": tp, "pp": pp}},
           "trainer": {"seed": 0}}
    host = ray.remote(EngineHost).options(num_cpus=0.25)
    actors = [host.remote(MegatronTrainEngine, cfg, 1) for _ in range(tp * pp * dp)]
    try:
        group = TrainGroup(actors)
        group.connect("127.0.0.1", "ddp")
        yield group
    finally:
        for actor in actors:
            ray.kill(actor)


def _hf_state(engine) -> dict[str, np.ndarray]:
    return {name: t.numpy().copy() for name, t in engine.named_tensors()}


def _logprobs(engine, batch):
    return engine.compute_logprobs(batch, with_entropy=True)


def grpo_step(groups, dp: int):
    ordered, shards = plan_shards(groups, ["math"], 2, dp, offset=0)
    batch, rewards, group_index = groups_to_batch(ordered, pad_id=0)
    return batch, rewards, group_index, shards


@pytest.mark.parametrize("tp,pp,dp", [(2, 1, 1), (1, 2, 1), (1, 1, 2)])
def test_parallel_ranks_match_one_process(ray_cluster, tiny_model_dir, random_groups, tp, pp, dp):
    groups = random_groups(6)
    objective = Objective.from_config({}, get_registries())
    batch, rewards, group_index, shards = grpo_step(groups, dp)
    embedded = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)), TrainConfig(**TRAIN), device="cpu")
    expected_lp = embedded.compute_logprobs(batch, with_entropy=True)
    one_batch = grpo_step(groups, 1)
    expected_metrics, _ = TrainStep(objective)(embedded, one_batch[:3], one_batch[3])
    expected = {name: t.numpy() for name, t in embedded.named_tensors()}

    with megatron_group(tiny_model_dir, tp, pp, dp) as group:
        for got in group.run(_logprobs, batch):
            assert (got["logprobs"] - expected_lp["logprobs"]).abs().max() < 1e-5
            assert (got["entropy"] - expected_lp["entropy"]).abs().max() < 1e-5
        metrics, _ = group.train(batch, rewards, group_index, shards, TrainStep(objective))
        states = group.run(_hf_state)
    assert metrics["train/loss"] == pytest.approx(expected_metrics["train/loss"], rel=1e-5, abs=1e-7)
    assert metrics["train/grad_norm"] == pytest.approx(expected_metrics["train/grad_norm"], rel=1e-5)
    assert metrics["train/entropy"] == pytest.approx(expected_metrics["train/entropy"], rel=1e-5)
    start = {name: t.numpy() for name, t in EmbeddedTrainEngine(
        ModelConfig(path=str(tiny_model_dir)), TrainConfig()).named_tensors()}
    assert max(float(np.abs(expected[k] - start[k]).max()) for k in start) > 1e-3
    for state in states:  # every rank exports the same, full HF weights
        assert list(state) == list(expected)
        assert max(float(np.abs(state[k] - expected[k]).max()) for k in expected) < 1e-5
