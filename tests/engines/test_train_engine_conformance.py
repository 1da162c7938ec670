"""Train engine vs. embedded rollout engine over real HTTP: same tokens, same weights, same
logprobs (within 1e-5 in fp32), before and after a train step synced through ``state_numpy``."""

from __future__ import annotations

import asyncio

import pytest
import torch

from loongsage.schema import ModelConfig, TrainConfig
from loongsage.engines.batch import TrainBatch
from loongsage.engines.client import EngineClient
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.controller.sft import token_mean_nll

PROMPTS = [[5, 17, 42, 99, 7], [300, 12], [8, 9, 10, 11, 12, 13, 14, 200, 201], [450]]
SAMPLING = {"max_new_tokens": 16, "temperature": 1.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def rollout(running_engine, tiny_model_dir):
    with running_engine(tiny_model_dir, max_running_requests=8, seed=3) as eng:
        yield eng


def generate(url: str) -> list:
    async def run():
        async with EngineClient(url, timeout=120) as client:
            return await asyncio.gather(*[client.agenerate(p, SAMPLING) for p in PROMPTS])

    return asyncio.run(run())


def as_batch(outs) -> TrainBatch:
    """Right-padded prompt+response rows, response positions in the loss mask."""
    rows = [p + list(o.output_ids) for p, o in zip(PROMPTS, outs)]
    length = max(map(len, rows))
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask = torch.zeros(len(rows), length)
    rollout_lp = torch.zeros(len(rows), length)
    for i, (prompt, out) in enumerate(zip(PROMPTS, outs)):
        ids[i, : len(rows[i])] = torch.tensor(rows[i])
        attn[i, : len(rows[i])] = 1
        mask[i, len(prompt) : len(rows[i])] = 1.0
        rollout_lp[i, len(prompt) : len(rows[i])] = torch.tensor(out.output_logprobs)
    return TrainBatch(ids, attn, mask, {"rollout_logprobs": rollout_lp})


def assert_same_logprobs(trainer: EmbeddedTrainEngine, batch: TrainBatch) -> None:
    mask = batch.loss_mask > 0
    got = trainer.compute_logprobs(batch)["logprobs"][mask]
    assert mask.sum() == len(PROMPTS) * SAMPLING["max_new_tokens"]
    torch.testing.assert_close(got, batch.extras["rollout_logprobs"][mask], atol=1e-5, rtol=0)


def test_rollout_and_train_logprobs_agree_before_and_after_a_weight_sync(rollout, tiny_model_dir):
    trainer = EmbeddedTrainEngine(
        ModelConfig(path=str(tiny_model_dir)), TrainConfig(lr=1e-3, micro_batch_size=3), device="cpu"
    )
    before = as_batch(generate(rollout.url))
    assert_same_logprobs(trainer, before)

    trainer.train_step(before, token_mean_nll)
    rollout.apply_weights(trainer.state_numpy(), version=trainer.weight_version)
    after = as_batch(generate(rollout.url))
    assert_same_logprobs(trainer, after)
    # the sync really changed the policy the rollout engine samples from
    old = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)), TrainConfig(), device="cpu")
    mask = after.loss_mask > 0
    drift = old.compute_logprobs(after)["logprobs"][mask] - after.extras["rollout_logprobs"][mask]
    assert drift.abs().max() > 1e-2
