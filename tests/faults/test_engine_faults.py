"""Fault injection on a real run: a rollout engine SIGKILLed or SIGSTOPped (hung) mid-run.

Real processes: the CLI in a subprocess (its own session) with its own Ray cluster, the tiny
recipe; the test signals the rollout engine's process (its pid is printed at start; the
restarted one's is in ``engine_events.jsonl``) right after a step is recorded, while the
next step generates. The run must reach its last step with
exit 0: the engine monitor restarts the engine in its bundle with the current weights, the
requests it held are sent again (each recorded in ``engine_events.jsonl``), every step
trains all its groups exactly once, and no process of the run outlives it (the killed
engine, the restarted one, the trainer, Ray's).
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from loongsage.controller.engine_health import process_state

pytestmark = [pytest.mark.slow, pytest.mark.serial]

STEPS, PROMPTS, N = 7, 4, 2
COMMON = (f"trainer.steps={STEPS}", "checkpoint.interval=0", "trainer.sft.steps=0",
          f"rollout.prompts_per_step={PROMPTS}", f"rollout.n_samples_per_prompt={N}",
          "rollout.max_new_tokens=24", f"logging.samples_per_step={PROMPTS * N}",
          "placement.share_process=false")  # the engine an actor of its own, to kill and restart alone


def restarts(run_dir) -> list[dict]:
    path = run_dir / "engine_events.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [row for row in rows if row["event"] == "restart"]


def test_a_killed_then_a_hung_engine_are_restarted_and_the_run_loses_nothing(tmp_path, runs, watched, leftovers):
    """SIGKILL of the engine once 2 steps are recorded, SIGSTOP of its replacement once 4 are."""
    run_dir = tmp_path / "run"
    run = watched(run_dir, *COMMON)
    proc = run.proc
    runs.wait_for(lambda: len(runs.metrics(run_dir)) >= 2, timeout=600, proc=proc)
    pids = run.actor_pids()
    os.kill(pids["rollout0"], signal.SIGKILL)
    runs.wait_for(lambda: restarts(run_dir) and len(runs.metrics(run_dir)) >= 4, timeout=600, proc=proc)
    os.kill(restarts(run_dir)[0]["pid"], signal.SIGSTOP)
    proc.wait(timeout=600)
    assert proc.returncode == 0, run.text[-4000:]
    assert leftovers(proc.pid) == []  # nothing of the run outlives it

    events = [json.loads(line) for line in (run_dir / "engine_events.jsonl").read_text().splitlines()]
    done = restarts(run_dir)
    assert [(e["replica"], e["reason"]) for e in done] == [
        (0, "its process is gone"), (0, "its process is stopped (hung)")]
    rows = runs.metrics(run_dir)
    assert [row["step"] for row in rows] == list(range(STEPS))  # every step once, none lost
    assert sum(row["rollout/engine_restarts"] for row in rows) == 2
    retried = [e for e in events if e["event"] == "retry"]
    assert sum(row["rollout/engine_retries"] for row in rows) == len(retried)
    assert all(e["replica"] == 0 and e["attempt"] == 1 for e in retried)
    for step in range(STEPS):  # every dispatched group trained whole: all its samples present
        samples = (run_dir / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()
        assert len(samples) == PROMPTS * N
    assert rows[-1]["train/weight_version"] == STEPS  # the restarted engines got every version
    for pid in [*pids.values(), *(e["pid"] for e in done)]:
        assert process_state(pid) == "gone", pid
    print(json.dumps({"restart_s": [e["seconds"] for e in done], "retried": len(retried)}))
