"""A black-box agent process that hangs: the timeout kills its process group, the trajectory
is marked failed, and its group is handled per ``rollout.failed_trajectory``.

Real processes: the ``command`` agent runs a Python program (the openai SDK against the real
router over the real embedded engine, tiny model); the first program to pass a flag file
hangs after its first model call (``time.sleep(60)``) until the agent's ``timeout_s`` kills
it. ``zero_reward`` trains the failed trajectory with reward 0 and counts it; ``drop_group``
generates the group again (no hang the second time) and counts the drop; a program that
always hangs ends the run with an error naming the prompt and the failure once the
regenerations (``reward.drop_group_retries``) are spent. No program outlives its group.
"""

from __future__ import annotations

import os
import sys

import pytest
from omegaconf import OmegaConf

from loongsage.config.validate import validate_config
from loongsage.controller.rollout import RolloutManager, TrajectoryFailed
from loongsage.data.scoring import RewardScorer
from loongsage.data.sources import build_sources
from loongsage.deadline.pool import DeadlinePool
from loongsage.engines.client import EngineClient
from loongsage.engines.pool import EnginePool
from loongsage.plugins import get_registries
from loongsage.runtime.event_loop import EventLoopThread

pytestmark = [pytest.mark.timeout(300), pytest.mark.serial]

# the flag is claimed atomically (O_EXCL): a group's two calls are answered in one engine
# step, so two programs checking for the flag and then creating it both found it missing
PROGRAM = """
import os, time, openai
client = openai.OpenAI(max_retries=0)
client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
def claim(flag):
    try:
        os.close(os.open(flag, os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False
if claim(os.path.join(FLAGS, "hung")) or ALWAYS:
    time.sleep(60)
print("done")
"""

# the first program to claim the flag exits before its first model call (a black-box agent
# that crashed at start-up); the others, and every one of a regenerated group, reach the model
DIES_FIRST = """
import os, sys, openai
try:
    os.close(os.open(os.path.join(FLAGS, "died"), os.O_CREAT | os.O_EXCL))
    sys.exit("agent crashed at start-up")
except FileExistsError:
    pass
client = openai.OpenAI(max_retries=0)
client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
print("done")
"""


def manager(tmp_path, tiny_model_dir, tiny_engine_url, policy: str, always: bool, loop, workers,
            program: str = PROGRAM):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    program = program.replace("FLAGS", repr(str(tmp_path))).replace("ALWAYS", str(always))
    cfg = OmegaConf.create({"model": {"path": "unused"}, "reward": {"drop_group_retries": 1},
                            "rollout": {"failed_trajectory": policy}, "data_sources": [{
        "name": "m", "dataset": {"format": "synthetic_math", "size": 8},
        "agent": {"name": "command", "argv": [sys.executable, "agent.py"], "files": {"agent.py": program},
                  "timeout_s": 12.0, "kill_grace_s": 0.5, "workdir_root": str(tmp_path / "work")},
        "reward": {"name": "math"}}]})
    spec = validate_config(cfg, get_registries())
    sources = build_sources(spec.sources, get_registries(), tokenizer=tokenizer)
    sampling = {"max_new_tokens": 4, "temperature": 1.0, "stop_token_ids": [tokenizer.eos_token_id]}
    return RolloutManager(sources, EnginePool([EngineClient(tiny_engine_url)]), loop, 2, sampling,
                          RewardScorer(workers, spec.cfg.reward.drop_group_retries),
                          failed_trajectory=spec.cfg.rollout.failed_trajectory), sources["m"]


@pytest.fixture
def running():
    loop = EventLoopThread()
    with DeadlinePool(1, preload=["loongsage_agents.rewards.math"]) as workers:
        yield loop, workers
    loop.close()


def no_program_left(tmp_path) -> bool:
    marker = str(tmp_path / "work")
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read()
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if cwd.startswith(marker) and b"agent.py" in cmdline:
            return False
    return True


def test_zero_reward_trains_the_hung_trajectory_with_reward_0(tmp_path, tiny_model_dir, tiny_engine_url, running):
    rollout, source = manager(tmp_path, tiny_model_dir, tiny_engine_url, "zero_reward", False, *running)
    [group] = rollout.generate_groups([source.get(0)], 0, 0)
    failed = [s for s in group.samples if s.reward_info.get("failed")]
    assert len(group.samples) == 2 and len(failed) == 1
    assert failed[0].reward == 0.0 and failed[0].reward_info["timed_out"] is True
    assert failed[0].reward_info["failed"] == "the agent process timed out and was killed"
    metrics = rollout.failure_metrics()
    assert metrics["rollout/failed_trajectories"] == 1 and metrics["rollout/failed_trajectory_groups_dropped"] == 0
    assert no_program_left(tmp_path)


def test_drop_group_generates_the_group_again(tmp_path, tiny_model_dir, tiny_engine_url, running):
    rollout, source = manager(tmp_path, tiny_model_dir, tiny_engine_url, "drop_group", False, *running)
    [group] = rollout.generate_groups([source.get(0)], 0, 0)
    assert len(group.samples) == 2 and not any(s.reward_info.get("failed") for s in group.samples)
    metrics = rollout.failure_metrics()
    assert metrics["rollout/failed_trajectory_groups_dropped"] == 1 and metrics["rollout/failed_trajectories"] == 0
    assert no_program_left(tmp_path)


def test_drop_group_gives_up_with_the_reason_once_regenerations_are_spent(tmp_path, tiny_model_dir,
                                                                          tiny_engine_url, running):
    rollout, source = manager(tmp_path, tiny_model_dir, tiny_engine_url, "drop_group", True, *running)
    with pytest.raises(TrajectoryFailed, match=r"prompt m\[0\] had a failed trajectory 2 times in a row .*"
                                               r"reward.drop_group_retries=1.*the agent process timed out"):
        rollout.generate_groups([source.get(0)], 0, 0)
    assert no_program_left(tmp_path)


def test_a_trajectory_dying_before_its_first_model_call_is_a_marked_sample_not_a_crash(
        tmp_path, tiny_model_dir, tiny_engine_url, running):
    """zero_reward: the group keeps both trajectories; the dead one is a failed sample holding
    only the prompt's tokens (nothing to train on, reward 0 in its group's baseline), naming
    the exit code and the program's last words; the batch builds with its row out of the loss."""
    from loongsage.controller.batching import groups_to_batch

    rollout, source = manager(tmp_path, tiny_model_dir, tiny_engine_url, "zero_reward", False, *running,
                              program=DIES_FIRST)
    prompt = source.get(0)
    [group] = rollout.generate_groups([prompt], 0, 0)
    [dead] = [s for s in group.samples if s.reward_info.get("died_before_model_call")]
    [alive] = [s for s in group.samples if s is not dead]
    assert dead.reward == 0.0 and dead.response_ids == [] and dead.loss_mask == []
    assert dead.reward_info["failed"] == ("the agent program ended (exit code 1) before its first "
                                          "model call: agent crashed at start-up")
    expected = source.agent.tokenizer.apply_chat_template(prompt.messages, tokenize=False,
                                                    add_generation_prompt=True)
    assert source.agent.tokenizer.decode(dead.prompt_ids) == expected
    assert sum(alive.loss_mask) > 0 and not alive.reward_info.get("failed")
    assert rollout.failure_metrics()["rollout/failed_trajectories"] == 1
    batch, rewards, _ = groups_to_batch([group], pad_id=0)
    row = group.samples.index(dead)
    assert batch.loss_mask[row].sum() == 0 and batch.loss_mask[1 - row].sum() == sum(alive.loss_mask)
    assert no_program_left(tmp_path)


def test_drop_group_generates_again_a_group_whose_trajectory_died_before_the_model(
        tmp_path, tiny_model_dir, tiny_engine_url, running):
    rollout, source = manager(tmp_path, tiny_model_dir, tiny_engine_url, "drop_group", False, *running,
                              program=DIES_FIRST)
    [group] = rollout.generate_groups([source.get(0)], 0, 0)
    assert len(group.samples) == 2 and not any(s.reward_info.get("failed") for s in group.samples)
    assert rollout.failure_metrics()["rollout/failed_trajectory_groups_dropped"] == 1
