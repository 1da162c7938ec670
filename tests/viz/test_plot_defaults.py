"""``loongsage plot``'s default panels on a default run's metrics: reward, entropy, response
length, step time and the train/inference mismatch in log scale (on a linear axis its 1e-14
values drew a flat zero), and not ``train/ppo_kl`` (0 with one optimizer step per batch); the
rows are written here in the shape ``metrics.jsonl`` has (no run needed to draw them)."""

from __future__ import annotations

import json
import subprocess
import sys

from loongsage.viz.plot import plot_runs

ROWS = [{"step": step, "rollout/reward_mean": 0.1 * step, "train/entropy": 2.0 - 0.1 * step,
         "rollout/response_length_mean": 12.0 + step, "timing/step": 4.3, "train/ppo_kl": 0.0,
         "train/is_approx_k3_kl": 3e-14 * (step + 1), "train/loss": 0.5} for step in range(4)]


def test_default_panels_and_the_mismatch_in_log_scale(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    plot = plot_runs([tmp_path / "run"])
    assert list(plot.series) == ["rollout/reward_mean", "train/entropy", "rollout/response_length_mean",
                                 "timing/step", "train/is_approx_k3_kl"]
    scales = {axis.get_title(): axis.get_yscale() for axis in plot.figure.axes if axis.get_visible()}
    assert scales == {"rollout/reward_mean": "linear", "train/entropy": "linear",
                      "rollout/response_length_mean": "linear", "timing/step": "linear",
                      "train/is_approx_k3_kl": "log"}
    assert plot.series["train/entropy"]["run"] == ([0, 1, 2, 3], [row["train/entropy"] for row in ROWS])


def test_the_metrics_option_picks_the_panels(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    out = tmp_path / "c.png"
    done = subprocess.run([sys.executable, "-m", "loongsage.cli", "plot", str(tmp_path / "run"), "--metrics",
                           "train/loss", "train/ppo_kl", "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 1000
    assert list(plot_runs([tmp_path / "run"], ["train/loss", "train/ppo_kl"]).series) == ["train/loss", "train/ppo_kl"]
