"""Rollout/train consistency on the tiny model: the logprobs the embedded rollout engine
returns over HTTP equal the embedded train engine's for the same tokens and weights (fp32,
within 1e-5), before and after a weight update streamed from the trainer."""

from __future__ import annotations

import asyncio

import torch

from loongsage.config.schema import ModelConfig, TrainConfig
from loongsage.engines.batch import TrainBatch
from loongsage.engines.client import EngineClient
from loongsage.engines.embedded_rollout import EmbeddedRolloutEngine
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.models.sft import token_mean_nll

PROMPTS = [[5, 17, 42, 99, 7], [300, 12], [8, 9, 10, 11, 12, 13, 14, 15, 200]]


def right_padded(rows: list[list[int]]) -> TrainBatch:
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return TrainBatch(ids, mask, mask.float())


def check_equal(client: EngineClient, trainer: EmbeddedTrainEngine) -> None:
    async def go():
        return await asyncio.gather(*[
            client.agenerate(p, {"max_new_tokens": 20, "ignore_eos": True}) for p in PROMPTS])

    outs = asyncio.run(go())
    batch = right_padded([p + o.output_ids for p, o in zip(PROMPTS, outs)])
    train_lp = trainer.compute_logprobs(batch)["logprobs"]
    for i, (p, o) in enumerate(zip(PROMPTS, outs)):
        ref = train_lp[i, len(p): len(p) + len(o.output_ids)]
        assert torch.allclose(torch.tensor(o.output_logprobs), ref, atol=1e-5, rtol=0)


def test_rollout_logprobs_equal_train_logprobs_before_and_after_sync(tiny_model_dir):
    trainer = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)),
                                  TrainConfig(lr=1e-2, micro_batch_size=2), device="cpu")
    engine = EmbeddedRolloutEngine(str(tiny_model_dir), num_threads=1, seed=2)
    client = EngineClient(engine.start(), timeout=120)
    try:
        check_equal(client, trainer)
        batch = right_padded([p + [3, 4, 5, 6] for p in PROMPTS])
        before = trainer.compute_logprobs(batch)["logprobs"]
        trainer.train_step(batch, token_mean_nll)
        assert (trainer.compute_logprobs(batch)["logprobs"] - before).abs().max() > 1e-3
        engine.apply_weights(trainer.state_numpy(), version=1)
        assert client.get_weight_version() == 1
        check_equal(client, trainer)
    finally:
        client.close()
        engine.stop()
