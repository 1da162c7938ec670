"""A colocated ``rollout.backend=sglang`` engine SIGKILLed mid-run gets the current weights through
``/update_weights_from_tensor`` again.

Real processes, as the other engine faults: the CLI in its own session, the SGLang stand-in
(``python -m loongsage.engines.embedded_rollout.sglang_compat``, the embedded server taking
SGLang's command line; SGLang itself cannot be installed here) launched by the engine's actor.
The test kills the actor once 2 steps are recorded (its server dies with it); the monitor
restarts it in its bundle, its bundle-mate train rank sends it the current version as
shared-memory handles, and the run ends with every step trained on weights the server really
holds: each step's samples carry one version, one more than the step before, and the server's
logprobs match the trainer's pi_old after the restart too.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.serial]

STEPS, PROMPTS, N = 4, 4, 2
STAND_IN = f"[{sys.executable},-m,loongsage.engines.embedded_rollout.sglang_compat]"


def test_a_killed_colocated_sglang_engine_is_restarted_with_the_current_weights(tmp_path, runs, watched, leftovers):
    run_dir = tmp_path / "run"
    run = watched(run_dir, f"trainer.steps={STEPS}", "checkpoint.interval=0", "trainer.sft.steps=2",
                  f"rollout.prompts_per_step={PROMPTS}", f"rollout.n_samples_per_prompt={N}",
                  "rollout.max_new_tokens=12", f"logging.samples_per_step={PROMPTS * N}",
                  "rollout.backend=sglang", f"rollout.sglang.launch_command={STAND_IN}",
                  "transfer.bucket_bytes=4000000")
    runs.wait_for(lambda: len(runs.metrics(run_dir)) >= 2, timeout=600, proc=run.proc)
    os.kill(run.actor_pids()["rollout0"], signal.SIGKILL)
    run.proc.wait(timeout=600)
    assert run.proc.returncode == 0, run.text[-4000:]
    assert leftovers(run.proc.pid) == []

    events = [json.loads(line) for line in (run_dir / "engine_events.jsonl").read_text().splitlines()]
    restarts = [e for e in events if e["event"] == "restart"]
    assert [(e["replica"], e["reason"]) for e in restarts] == [(0, "its process is gone")]
    rows = runs.metrics(run_dir)
    assert [row["step"] for row in rows] == list(range(STEPS))
    # the tiny model's 13 MB in 4 MB buckets, one request per bucket, from the bundle-mate train rank
    assert all(row["perf/weight_sync_tensor_requests"] >= 3 and row["perf/weight_sync_senders"] == 1 for row in rows)
    versions = []
    for step in range(STEPS):
        samples = [json.loads(line) for line in
                   (run_dir / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()]
        assert len(samples) == PROMPTS * N  # nothing lost to the kill
        step_versions = {v for row in samples for v in row["weight_versions"]}
        assert len(step_versions) == 1
        versions.append(step_versions.pop())
        gaps = [abs(a - b) for row in samples for a, b in zip(row["rollout_logprobs"], row["train_logprobs"])]
        assert gaps and max(gaps) < 1e-3  # the server holds the trainer's weights, restarted or not
    assert versions == list(range(versions[0], versions[0] + STEPS))
    assert restarts[0]["weight_version"] in versions  # the restart was sent the version then current
    print(json.dumps({"restart_s": restarts[0]["seconds"], "versions": versions}))
