"""Fault injection at a weight update: the rollout engine SIGKILLed in the middle of a weight
sync, and in the middle of a partial-rollout pause.

Real processes: the CLI in a subprocess (its own session and Ray cluster), the tiny recipe, real
TransferMesh, engine and monitor. Hitting the window: a weight sync of the tiny model takes
milliseconds and a pause little more, far too short to hit from outside by timing, so the
engine is the embedded one from a config-local plugin module (``fault_plugins.py``, loaded
through ``plugins:`` like any third-party engine, no test hook in the product) that, once per
run, writes its pid and stops at the chosen point; the test then SIGKILLs that pid. A short
supervised warm start moves the weights away from the initial ones first, so an engine that
came back with the initial weights, or any version but the trainer's, shows in its logprobs.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from loongsage.controller.engine_health import process_state

pytestmark = [pytest.mark.slow, pytest.mark.serial]

PROMPTS, N = 4, 2
COMMON = ("plugins=[fault_plugins]", "checkpoint.interval=0", "trainer.sft.steps=4",
          "trainer.sft.examples=64", f"rollout.prompts_per_step={PROMPTS}",
          f"rollout.n_samples_per_prompt={N}", f"logging.samples_per_step={PROMPTS * N}",
          "placement.share_process=false")  # the engine an actor of its own, to kill and restart alone


def events(run_dir, kind: str) -> list[dict]:
    path = run_dir / "engine_events.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [row for row in rows if row["event"] == kind]


def samples(run_dir, step: int) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()]


def kill_when_stopped(runs, run, run_dir, name: str) -> tuple[int, float]:
    """SIGKILL the engine once it wrote ``faults/<name>`` (it stopped there); (pid, time of the kill)."""
    path = run_dir / "faults" / name
    runs.wait_for(path.exists, timeout=300, proc=run.proc)
    pid = int(path.read_text())
    assert pid == run.actor_pids()["rollout0"]  # the engine of the run, stopped where wanted
    os.kill(pid, signal.SIGKILL)
    return pid, time.time()


def test_an_engine_killed_in_a_weight_sync_is_restarted_with_the_trainers_weights(tmp_path, runs, watched,
                                                                                   leftovers):
    """Killed while applying weight version 3 (the sync after step 1): the trainer's sync fails
    for that engine, ``EngineMonitor.heal`` (or the monitor thread, whichever looks first)
    restarts it in its bundle and sends it version 3; steps 2 and 3 then sample only from the
    trainer's current version, with the trainer's logprobs."""
    steps = 4
    run_dir = tmp_path / "run"
    run = watched(run_dir, *COMMON, f"trainer.steps={steps}", "rollout.max_new_tokens=16",
                  "rollout.backend=sync_stopping_rollout")
    pid, killed_at = kill_when_stopped(runs, run, run_dir, "sync")
    run.proc.wait(timeout=300)
    assert run.proc.returncode == 0, run.text[-4000:]
    assert leftovers(run.proc.pid) == []

    [restart] = events(run_dir, "restart")  # one restart, for the one kill
    assert (restart["replica"], restart["reason"], restart["weight_version"]) == (0, "its process is gone", 3)
    assert process_state(pid) == "gone" and process_state(restart["pid"]) == "gone"
    rows = runs.metrics(run_dir)
    assert [row["step"] for row in rows] == list(range(steps))
    assert sum(row["rollout/engine_restarts"] for row in rows) == 1
    assert [row["train/weight_version"] for row in rows] == [2, 3, 4, 5]  # 1: the warm start's
    trained, gaps = [], []
    for step in range(steps):
        saved = samples(run_dir, step)
        assert len(saved) == PROMPTS * N  # every group trained, whole
        trained += sorted({s["group_id"] for s in saved})
        if step < 2:
            continue
        # after the restart: every token sampled by the trainer's version of that step, with its logprobs
        assert {v for s in saved for v in s["weight_versions"]} == {step + 1}, step
        gap = max(abs(r - t) for s in saved for r, t, m in zip(s["rollout_logprobs"], s["train_logprobs"],
                                                               s["loss_mask"]) if m)
        assert gap < 1e-3, (step, gap)
        gaps.append(gap)
        assert rows[step]["train/is_approx_k3_kl"] < 1e-6, rows[step]
    assert trained == list(range(steps * PROMPTS))  # every dispatched group trained once
    print(json.dumps({"restart_s": restart["seconds"], "kill_to_restarted_s": round(restart["time"] - killed_at, 2),
                      "retried": len(events(run_dir, "retry")), "logprob_gap": max(gaps)}))


def test_an_engine_killed_in_a_partial_rollout_pause_loses_no_group(tmp_path, runs, watched, leftovers):
    """Asynchronous, partial rollout, decode batch capped at 2 rows so a weight update finds
    requests running and queued: the engine is killed in the update's abort-all, while the pool
    holds new requests. The requests it held fail and come back to their groups as aborted
    (nothing sampled on the dead engine is kept: its reply never arrived), the groups wait
    with the other partial ones and are continued under the new weights on the restarted
    engine. Every dispatched group is trained once or still pending at the end; every sample's
    versions only go forward and never pass the trainer's."""
    steps = 4
    run_dir = tmp_path / "run"
    run = watched(run_dir, *COMMON, f"trainer.steps={steps}", "rollout.max_new_tokens=48",
                  "rollout.max_running_requests=2", "rollout.partial=true", "async.enable=true",
                  "placement.mode=disaggregated", "async/window_policy=windowed_fifo", "async.stale_steps=1",
                  "rollout.backend=abort_stopping_rollout")
    pid, killed_at = kill_when_stopped(runs, run, run_dir, "abort")
    run.proc.wait(timeout=300)
    assert run.proc.returncode == 0, run.text[-4000:]
    assert leftovers(run.proc.pid) == []

    [restart] = events(run_dir, "restart")
    assert restart["replica"] == 0 and process_state(pid) == "gone"
    rows = runs.metrics(run_dir)
    assert [row["step"] for row in rows] == list(range(steps))
    assert sum(row["rollout/engine_restarts"] for row in rows) == 1
    retried = events(run_dir, "retry")
    assert retried and sum(row["rollout/engine_retries"] for row in rows) == len(retried)
    trained, continued = [], 0
    for step, row in enumerate(rows):
        saved = samples(run_dir, step)
        assert len(saved) == PROMPTS * N
        trained += sorted({s["group_id"] for s in saved})
        trainer_version = row["train/weight_version"] - 1  # the version that was live while the batch generated
        for s in saved:
            versions = s["weight_versions"]
            assert versions == sorted(versions) and versions[-1] <= trainer_version, (step, versions)
            continued += len(set(versions)) > 1
    assert len(trained) == len(set(trained)) == steps * PROMPTS  # none trained twice
    state = json.loads((run_dir / "checkpoints" / f"step_{steps - 1:06d}" / "state.json").read_text())
    pipeline = state["scheduler"]["pipeline"]
    pending = [e["seq"] for e in pipeline["uncollected"] + pipeline["buffer"]]
    assert sorted(trained + pending) == list(range(pipeline["next_seq"]))  # none lost
    print(json.dumps({"restart_s": restart["seconds"], "kill_to_restarted_s": round(restart["time"] - killed_at, 2),
                      "retried": len(retried), "continued_samples": continued}))
