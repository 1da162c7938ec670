"""``rollout.backend=sglang``: the launcher's argv, its errors, and the tiny recipe end to end.

SGLang cannot be installed on these CPU machines, so the end-to-end test points
``rollout.sglang.launch_command`` at ``python -m loongsage.engines.embedded_rollout.sglang_compat``
(the embedded server taking SGLang's command line, refusing flags it does not know) and runs
the very code path a GPU run takes: the argv, the health wait, registration in the pool, and
every weight update: colocated over ``/update_weights_from_tensor`` (shared-memory handles here,
CUDA IPC handles on GPUs), disaggregated over ``/init_weights_update_group`` +
``/update_weights_from_distributed`` (gloo here, NCCL on GPUs). The real SGLang run is in
``benchmarks/gpu_check.py``; it has not run on a GPU.
"""

from __future__ import annotations

import json
import sys

import pytest

from loongsage.engines.replies import EngineError
from loongsage.engines.embedded_rollout.sglang_compat import parse_args
from loongsage.engines.sglang.engine import SGLangServerEngine

COMPAT = [sys.executable, "-m", "loongsage.engines.embedded_rollout.sglang_compat"]


def test_argv_carries_sglangs_flags_and_the_stand_in_parses_every_one():
    engine = SGLangServerEngine("/models/m", launch_command=["python", "-m", "sglang.launch_server"], tp_size=1,
                                mem_fraction_static=0.7, max_running_requests=16, context_length=2048,
                                routed_experts=True, memory_saver=True, radix_cache=False,
                                extra_args=["--log-level", "info"])
    argv = engine.launch_argv("127.0.0.1", 30000)
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    pairs = dict(zip(argv[3::1], argv[4::1]))
    assert pairs["--model-path"] == "/models/m" and pairs["--port"] == "30000" and pairs["--tp-size"] == "1"
    assert pairs["--mem-fraction-static"] == "0.7" and pairs["--context-length"] == "2048"
    assert pairs["--max-running-requests"] == "16" and pairs["--weight-version"] == "0"
    assert {"--enable-return-routed-experts", "--enable-memory-saver", "--skip-server-warmup",
            "--disable-radix-cache"} <= set(argv)
    assert argv[-2:] == ["--log-level", "info"]
    args = parse_args(argv[3:-2])  # everything the launcher passes, and nothing unknown, is accepted
    assert args.model_path == "/models/m" and args.port == 30000 and args.enable_memory_saver
    assert args.disable_radix_cache
    assert "--disable-radix-cache" not in SGLangServerEngine("/models/m", launch_command=["sglang"]).launch_argv("h", 1)
    with pytest.raises(SystemExit):
        parse_args(argv[3:])  # an unknown flag is refused, not ignored


def test_a_server_that_exits_fails_the_start_with_its_log():
    engine = SGLangServerEngine("/nowhere", launch_command=COMPAT, startup_timeout_s=120)
    with pytest.raises(EngineError, match=r"the server exited with 2; its log ends:\n.*model-path|"
                                          r"the server exited with 1; its log ends:\n"):
        engine.start()
    assert engine.process is None


@pytest.mark.slow
def test_tiny_recipe_runs_through_the_launcher_with_distributed_weight_updates(tmp_path, tiny_model_dir):
    """Disaggregated: every update through ``/init_weights_update_group`` +
    ``/update_weights_from_distributed`` (gloo; the asynchronous runtime, which disaggregated
    placement requires, with no staleness, so each step samples the version just published).
    The colocated path (``/update_weights_from_tensor``) runs end to end, across a restart, in
    ``tests/faults/test_sglang_restart.py``; one run each keeps the CI budget."""
    import subprocess

    run_dir = tmp_path / "run"
    steps = 3
    command = "[" + ",".join(COMPAT) + "]"
    result = subprocess.run(
        [sys.executable, "-m", "loongsage.cli", "train", "--config-name", "tiny/grpo", f"trainer.run_dir={run_dir}",
         "logging.progress_bar=false", f"trainer.steps={steps}", "trainer.sft.steps=3", "rollout.prompts_per_step=4",
         "rollout.n_samples_per_prompt=2", "rollout.max_new_tokens=12", "rollout.backend=sglang",
         "placement.mode=disaggregated", "async.enable=true", "async.stale_steps=0",
         f"rollout.sglang.launch_command={command}", "transfer.bucket_bytes=4000000"],
        capture_output=True, text=True, timeout=900, env={**__import__("os").environ, "RAY_AUTH_MODE": "disabled"})
    assert result.returncode == 0, result.stderr[-4000:]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    syncs = [row for row in metrics if "timing/step" in row]
    assert len(syncs) == steps
    assert all("perf/weight_sync_tensor_requests" not in row for row in syncs)
    for step in range(steps):
        rows = [json.loads(line) for line in (run_dir / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()]
        # the warm start published version 1; the server sampled step k with version k + 1:
        # every update reached it
        assert {v for row in rows for v in row["weight_versions"]} == {step + 1}
        # and its weights are the trainer's (changed by the warm start): its logprobs match pi_old
        gaps = [abs(a - b) for row in rows for a, b in zip(row["rollout_logprobs"], row["train_logprobs"])]
        assert gaps and max(gaps) < 1e-3
