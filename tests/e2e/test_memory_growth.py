"""The train actor's memory does not grow with the steps: 30 tiny GRPO steps, real Ray actors.

Response lengths vary within and across steps (the short warm start teaches a short boxed
answer the model follows only part of the time at temperature 1: step means from about 25 to
60 of 64 tokens), so the allocator sees a different layout every step.
The train actor's RSS after step 30 must be within 10 % of its RSS after step 5. Before the
fix it grew by about one step's activations per Ray pool thread the train calls rotated over.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

STEPS = 30
OVERRIDES = (
    f"trainer.steps={STEPS}",
    "checkpoint.interval=0",
    "rollout.prompts_per_step=8",
    "rollout.n_samples_per_prompt=8",
    "rollout.max_new_tokens=64",
    "train.micro_batch_size=64",
    "logging.samples_per_step=0",
)


def test_train_actor_rss_stays_flat_over_30_steps(tmp_path, runs):
    result = runs.train(tmp_path / "run", *OVERRIDES)
    rows = runs.metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(STEPS))
    lengths = [r["rollout/response_length_mean"] for r in rows]
    assert max(lengths) - min(lengths) >= 8, f"response lengths hardly varied: {lengths}"
    rss = [r["perf/train_rss_gb"] for r in rows]
    after_5, after_30 = rss[4], rss[29]
    assert abs(after_30 - after_5) <= 0.10 * after_5, f"train actor RSS after each step (GB): {rss}"
    peaks = [r["perf/train_rss_peak_gb"] for r in rows]
    assert all(peak >= low for peak, low in zip(peaks, rss))
    assert all(r["perf/rollout_rss_gb"] > 0 and r["perf/run_pss_peak_gb"] > after_5 for r in rows)
    assert "memory peak: train actor RSS" in result.stdout
