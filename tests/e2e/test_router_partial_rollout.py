"""Partial rollout with a router-based agent end to end (recipe ``tiny/tool_calculator``: every
rollout is a ``tool_loop`` conversation through the run's AgentFlow router), in colocated mode
with oversampling and in fully-async mode. Real CLI, Ray, engine, router and sandbox. The
engine's decode batch is capped (``rollout.max_running_requests``) so groups finish in waves
and a weight update finds turns mid-generation: those are aborted, held while the weights
change (colocated: while the trainer holds the device) and continued by the router. The runs
finish, some trained samples carry two weight versions, every token's lag stays within the
staleness bound, and each persisted trajectory's versions only go forward."""

from __future__ import annotations

import json
import shutil

import pytest

pytestmark = pytest.mark.slow

COMMON = ("trainer.steps=4", "trainer.sft.steps=0", "rollout.prompts_per_step=2",
          "rollout.n_samples_per_prompt=2", "rollout.partial=true", "checkpoint.interval=0",
          "logging.samples_per_step=8")
MODES = {
    # S = 0, O = 2, B = 2: the bound is S' = S + ceil(O / B) = 1
    "colocated": (("placement.mode=colocated", "rollout.oversample_groups=2", "rollout.max_new_tokens=96",
                   "rollout.max_running_requests=4"), 1),
    # the update comes after training: longer turns on 2 decode rows are still running then
    "async": (("async.enable=true", "placement.mode=disaggregated", "async/window_policy=windowed_fifo",
               "async.stale_steps=1", "rollout.max_new_tokens=256", "rollout.max_running_requests=2"), 1),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_router_agent_turns_continue_across_weight_updates(mode, tmp_path, runs):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (the recipe's sandbox)")
    overrides, bound = MODES[mode]
    run_dir = tmp_path / mode
    runs.train(run_dir, *COMMON, *overrides, config="tiny/tool_calculator")
    rows = runs.metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for row in rows:
        assert 0.0 <= row["async/staleness_mean"] <= row["async/staleness_max"] <= bound, row
        assert row["train/weight_version"] == row["step"] + 1
    assert max(r["rollout/partial_ratio"] for r in rows) > 0
    assert max(r["rollout/continued_turns_mean"] for r in rows) > 0
    lines = (run_dir / "trajectories" / "arithmetic" / "trajectories.jsonl").read_text().splitlines()
    continued = 0
    for traj in map(json.loads, lines):
        versions = [v for v, m in zip(traj["versions"], traj["loss_mask"]) if m]
        assert versions == sorted(versions), traj["trajectory_id"]
        if traj["status"] == "finished" and len(set(versions)) == 2 and traj["metadata"].get("continued_turns"):
            continued += 1
    assert continued >= 1, "no persisted trajectory holds a turn continued under new weights"
    trained = [json.loads(line) for step in range(4)
               for line in (run_dir / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()]
    assert len(trained) == 4 * 2 * 2
