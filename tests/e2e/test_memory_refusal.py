"""``loongsage train`` refuses a run its start-up memory estimate says this machine cannot hold.

The real CLI in a subprocess: the estimate is made from the model folder, the batch and the
data sources' rendered prompts, before any step; the error names the setting to lower.
"""

from __future__ import annotations

import subprocess

# share_prompt off: with it a micro-batch holds one group at most (64 rows), which would fit
HUGE_BATCH = ("rollout.prompts_per_step=4096", "rollout.n_samples_per_prompt=64", "train.micro_batch_size=100000",
              "train.share_prompt=false")


def test_a_run_that_cannot_fit_is_refused_naming_the_settings(tmp_path, runs):
    args = [*runs.cli, "train", "--config-name", "tiny/grpo", f"trainer.run_dir={tmp_path}",
            "logging.progress_bar=false", *HUGE_BATCH]
    result = subprocess.run(args, capture_output=True, text=True, env=runs.env(), timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: train.micro_batch_size: the run needs about memory estimate"), error
    assert "100000 rows" in error and "placement.memory_check=warn" in error
    assert not (tmp_path / "metrics.jsonl").exists()
