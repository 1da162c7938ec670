"""An async run with partial rollout, killed mid-way, resumes with no group lost or trained twice.

Real processes: the CLI in a subprocess (disaggregated placement, windowed_fifo S=1, partial
rollout, one oversampled group), SIGKILLed with its Ray cluster after a checkpoint, then
resumed with ``trainer.resume=true``. Every trained group is read back from the per-step
sample files (all samples are saved), the pending ones from the final checkpoint.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

STEPS = 6
COMMON = (
    f"trainer.steps={STEPS}",
    "async.enable=true",
    "placement.mode=disaggregated",
    "async/window_policy=windowed_fifo",
    "async.stale_steps=1",
    "rollout.partial=true",
    "rollout.oversample_groups=1",
    "checkpoint.interval=1",
    "checkpoint.keep_last=2",
    "trainer.sft.steps=0",
    "rollout.prompts_per_step=4",
    "rollout.n_samples_per_prompt=2",
    "rollout.max_new_tokens=24",
    "logging.samples_per_step=8",
)


def trained_groups(run_dir, step: int) -> dict[int, tuple[str, int]]:
    rows = [json.loads(line) for line in (run_dir / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()]
    assert len(rows) == 8, f"step {step}: {len(rows)} samples saved, expected all 8"
    return {r["group_id"]: (r["source"], r["prompt_index"]) for r in rows}


def test_killed_async_run_resumes_without_losing_or_repeating_groups(tmp_path, runs):
    run_dir = tmp_path / "crashed"
    last = runs.kill_after_a_checkpoint(run_dir, STEPS, *COMMON)

    resumed = runs.train(run_dir, *COMMON, "trainer.resume=true")
    assert f"continuing at step {last + 1}" in resumed.stdout
    rows = runs.metrics(run_dir)
    assert [row["step"] for row in rows] == list(range(STEPS))
    assert all(row["async/staleness_max"] <= 1 + 1 for row in rows)  # S' = S + ceil(O / B)

    trained: dict[int, tuple[str, int]] = {}
    for step in range(STEPS):
        groups = trained_groups(run_dir, step)
        assert len(groups) == 4 and not set(groups) & set(trained), f"step {step} repeats a group"
        trained.update(groups)
    assert len(set(trained.values())) == len(trained), "a prompt was trained twice under another group id"
    state = json.loads((run_dir / "checkpoints" / f"step_{STEPS - 1:06d}" / "state.json").read_text())
    pipeline = state["scheduler"]["pipeline"]
    pending = [e["seq"] for e in pipeline["uncollected"] + pipeline["buffer"]]
    assert sorted([*trained, *pending]) == list(range(pipeline["next_seq"])), "a dispatched group was lost"
