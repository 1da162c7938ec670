"""Recorded batches (``controller.recording``), what reads them (``recorded_rollout``, ``replay``)
and their refusals: a recorded step rebuilds the trained ``TrainBatch`` bit for bit, and a
missing batch, checkpoint or wrong override is named with what to do."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from loongsage.controller.batching import groups_to_batch
from loongsage.controller.recorded_rollout import RecordedBatches, check_recording
from loongsage.controller.recording import batch_path, load_batch, recorded_steps, save_batch
from loongsage.controller.replay import apply_overrides, replay_step
from loongsage.data.types import Group, Prompt, Sample


def group(group_id: int, routes: bool = False) -> Group:
    rng = np.random.default_rng(group_id)
    samples = []
    for i in range(3):
        n = 4 + i
        prompt = [int(t) for t in rng.integers(0, 500, 5)]
        samples.append(Sample(
            prompt_ids=prompt, response_ids=[int(t) for t in rng.integers(0, 500, n)],
            response_logprobs=[float(np.float32(x)) for x in rng.normal(-3, 1, n)],
            weight_versions=[group_id] * n, loss_mask=[1] * (n - 1) + [0], reward=float(rng.random()),
            reward_info={"correct": bool(i % 2), "boxed": 1.5}, finish_reason="length",
            train_logprobs=[0.5] * n, advantages=[0.25] * n, sampling_seed=12345 + i,
            routed_experts=rng.integers(-1, 8, (5 + n, 2, 2)) if routes else None))
    return Group(group_id, Prompt("math", 40 + group_id, [{"role": "user", "content": "hi"}], "4"), samples, group_id)


def test_a_recorded_step_rebuilds_the_same_batch_bit_for_bit(tmp_path):
    groups = [group(3), group(1, routes=True)]
    path = save_batch(tmp_path, 7, groups)
    assert path == batch_path(tmp_path, 7) and path.stat().st_size < 4096
    loaded = load_batch(tmp_path, 7)
    assert [g.group_id for g in loaded] == [3, 1]
    assert loaded[0].samples[1].sampling_seed == 12346
    assert loaded[0].samples[0].train_logprobs == [] and loaded[0].samples[0].advantages == []  # results left out
    assert np.array_equal(loaded[1].samples[2].routed_experts, groups[1].samples[2].routed_experts)
    before, rewards, index = groups_to_batch(groups, 0)
    after, rewards2, index2 = groups_to_batch(loaded, 0)
    for name in ("input_ids", "attention_mask", "loss_mask"):
        assert torch.equal(getattr(before, name), getattr(after, name))
    for name, tensor in before.extras.items():
        assert torch.equal(tensor, after.extras[name]), name
    assert torch.equal(rewards, rewards2) and torch.equal(index, index2)
    assert recorded_steps(tmp_path) == [7]
    assert RecordedBatches(tmp_path).next_batch(7)[1].prompt.index == 41


def test_missing_batches_are_named_with_the_setting_that_records_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="rollout.record=true"):
        load_batch(tmp_path, 2)
    save_batch(tmp_path, 0, [group(0)])
    with pytest.raises(ValueError, match=r"batches of steps 0..2; it holds steps 0..0 \(1 batches\)"):
        check_recording(tmp_path, 3)
    with pytest.raises(ValueError, match="trainer.eval_interval=0"):
        check_recording(tmp_path, 1, eval_interval=5)
    assert check_recording(tmp_path, 1) == tmp_path


def test_overrides_pick_a_plugin_or_set_a_value_and_refuse_other_shapes():
    cfg = OmegaConf.create({"algorithm": {"policy_loss": {"name": "ppo_clip", "eps_low": 0.2}, "kl": {"coef": 0.0}}})
    apply_overrides(cfg, ["algorithm/policy_loss=gspo", "algorithm.kl.coef=0.1"])
    assert OmegaConf.to_container(cfg.algorithm) == {"policy_loss": {"name": "gspo"}, "kl": {"coef": 0.1}}
    with pytest.raises(ValueError, match="expected key=value"):
        apply_overrides(cfg, ["algorithm.kl.coef"])


def test_replay_refuses_a_step_without_its_starting_checkpoint(tmp_path):
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml({"train": {"dp_size": 1}}))
    with pytest.raises(ValueError, match="first step it can replay is 1"):
        replay_step(tmp_path, 0)
    with pytest.raises(FileNotFoundError, match="checkpoint.interval=1"):
        replay_step(tmp_path, 3)
