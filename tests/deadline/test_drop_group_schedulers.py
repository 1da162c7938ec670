"""``on_error: drop_group`` under both schedulers, on the real tiny rollout engine over HTTP
with the single-turn agent and reward worker processes: a dropped group is generated again
from its prompt, so every batch still fills with complete, successfully scored groups and
the drops are counted."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from loongsage.config.validate import validate_config
from loongsage.controller.rollout import RolloutManager
from loongsage.data.mixer import DataMixer
from loongsage.data.scoring import RewardScorer
from loongsage.data.sources import build_sources
from loongsage.deadline.pool import DeadlinePool
from loongsage.engines.client import EngineClient
from loongsage.engines.pool import EnginePool
from loongsage.runtime.async_scheduler import AsyncScheduler
from loongsage.runtime.event_loop import EventLoopThread
from loongsage.runtime.prompt_source import BatchedPromptSource
from loongsage.runtime.scheduler import build_window_policy
from loongsage.runtime.sync_scheduler import SyncScheduler

pytestmark = [pytest.mark.timeout(300), pytest.mark.serial]
B = 4


@pytest.fixture
def rollout(registries, tiny_engine_url, tiny_model_dir, tmp_path):
    """A rollout manager whose reward (``flaky``) fails the first call of every even prompt."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = OmegaConf.create({"model": {"path": "unused"}, "data_sources": [{
        "name": "m", "dataset": {"format": "synthetic_math", "size": 64},
        "reward": {"name": "flaky", "state_dir": str(tmp_path), "on_error": "drop_group"}}]})
    run = validate_config(cfg, registries)
    sources = build_sources(run.sources, registries, tokenizer=tokenizer)
    loop = EventLoopThread()
    with DeadlinePool(2, preload=["deadline_probes"]) as workers:
        sampling = {"max_new_tokens": 4, "temperature": 1.0, "stop_token_ids": [tokenizer.eos_token_id]}
        manager = RolloutManager(sources, EnginePool([EngineClient(tiny_engine_url)]), loop, 2, sampling,
                                 RewardScorer(workers))
        yield manager, DataMixer.from_sources(sources, seed=0, batch_size=B)
    loop.close()


def check_batch(batch):
    assert len(batch) == B and all(len(g.samples) == 2 for g in batch)
    for group in batch:  # the regenerated group, scored without failure
        assert [s.reward for s in group.samples] == [0.5, 0.5]
        assert all("reward_failure" not in s.reward_info for s in group.samples)


def test_sync_scheduler_fills_the_batch(rollout):
    manager, mixer = rollout
    scheduler = SyncScheduler(mixer, manager.generate_groups, B)
    batch = scheduler.next_batch(0)
    check_batch(batch)
    even = sum(g.prompt.index % 2 == 0 for g in batch)
    assert even > 0  # the mixer's seeded draw holds even prompts, each dropped once
    assert manager.reward_metrics() == {"rollout/reward_timeouts": 0.0, "rollout/reward_errors": float(even),
                                        "rollout/reward_dropped_groups": float(even)}


def test_async_scheduler_fills_every_batch(rollout, registries):
    manager, mixer = rollout
    policy = build_window_policy(registries.resolve("window_policy", "no_window", "async.window_policy"))
    scheduler = AsyncScheduler(policy, BatchedPromptSource(mixer, B), manager.generate_group, B, 1,
                               loop=manager.loop)
    try:
        trained = []
        for step in range(2):
            batch = scheduler.next_batch(step)
            check_batch(batch)
            trained += batch
            scheduler.on_weights_updated(step + 1)
    finally:
        scheduler.close()
    counts = manager.reward_metrics()
    even = sum(g.prompt.index % 2 == 0 for g in trained)
    assert even > 0 and counts["rollout/reward_dropped_groups"] >= even  # groups still in flight may add more
    assert counts["rollout/reward_errors"] == counts["rollout/reward_dropped_groups"]
