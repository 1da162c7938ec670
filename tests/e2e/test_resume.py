"""A training run killed mid-way resumes at the step after its last checkpoint, same data.

Real processes throughout: the CLI in a subprocess with its own local Ray cluster, killed
with SIGKILL (process group, Ray included), then resumed with ``trainer.resume=true``. The
run trains on two FSDP2 ranks (``train.dp_size=2``), so the checkpoint is the sharded one
and the resumed ranks load their shards; every step must train exactly the groups of an
uninterrupted run: none lost, none trained twice.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

STEPS = 5
COMMON = (
    f"trainer.steps={STEPS}",
    "checkpoint.interval=1",
    "checkpoint.keep_last=2",
    "trainer.sft.steps=0",
    "rollout.prompts_per_step=4",
    "rollout.n_samples_per_prompt=2",
    "rollout.max_new_tokens=12",
    "logging.samples_per_step=8",
    "train.dp_size=2",
    "train.strategy=fsdp2",
    "placement.train_cpus=0.5",
    "placement.rollout_cpus=0.5",
)


def test_killed_run_resumes_at_next_step_with_the_same_data(tmp_path, runs):
    reference, crashed = tmp_path / "reference", tmp_path / "crashed"
    runs.train(reference, *COMMON)

    last = runs.kill_after_a_checkpoint(crashed, STEPS, *COMMON)

    resumed = runs.train(crashed, *COMMON, "trainer.resume=true")
    assert f"continuing at step {last + 1}" in resumed.stdout
    assert [row["step"] for row in runs.metrics(crashed)] == list(range(STEPS))
    for step in range(STEPS):
        assert runs.trained_prompts(crashed, step) == runs.trained_prompts(reference, step), step
    assert len({runs.trained_prompts(reference, s)[0] for s in range(STEPS)}) == STEPS
    checkpoint = crashed / "checkpoints" / f"step_{STEPS - 1:06d}" / "trainer"
    assert len(list((checkpoint / "sharded").glob("*.distcp"))) == 2
