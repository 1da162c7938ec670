"""``loongsage plot`` on a real tiny run: the PNG has the figure's size, every default panel
that the run logged is drawn, and each line's points are exactly the run's metrics.jsonl
values (read back from the figure's artists); a second run overlays as a second line."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from PIL import Image

from loongsage.errors import LoongSageError
from loongsage.tracking.jsonl import read_metrics
from loongsage.viz.plot import DEFAULT_METRICS, plot_runs

pytestmark = pytest.mark.slow


def finite_points(rows, metric):
    return [(r["step"], r[metric]) for r in rows if isinstance(r.get(metric), (int, float)) and math.isfinite(r[metric])]


def test_cli_writes_a_png_of_the_figures_size(tiny_run, tmp_path):
    out = tmp_path / "curves.png"
    result = subprocess.run([sys.executable, "-m", "loongsage.cli", "plot", str(tiny_run), "-o", str(out),
                             "--dpi", "50"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(out)
    figure = plot_runs([tiny_run]).figure
    width, height = figure.get_size_inches()
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (round(width * 50), round(height * 50))


def test_plotted_series_are_the_runs_metrics_and_runs_overlay(tiny_run, tmp_path):
    rows = read_metrics(tiny_run / "metrics.jsonl")
    other = tmp_path / "other_run"
    other.mkdir()
    shifted = [{**r, "rollout/reward_mean": (r.get("rollout/reward_mean") or 0.0) + 1.0} for r in rows]
    (other / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in shifted))
    plot = plot_runs([tiny_run, other])
    logged = {k for r in rows for k in r}
    assert list(plot.series) == [m for m in DEFAULT_METRICS if m in logged]
    assert {"rollout/reward_mean", "eval/correct_mean", "train/entropy", "rollout/response_length_mean",
            "train/is_approx_k3_kl", "timing/step"} <= set(plot.series)
    axes = [a for a in plot.figure.axes if a.get_visible()]
    for axis, metric in zip(axes, plot.series):
        assert axis.get_title() == metric
        lines = {line.get_label(): line.get_xydata().tolist() for line in axis.get_lines()}
        assert set(lines) == {tiny_run.name, "other_run"}
        assert [tuple(p) for p in lines[tiny_run.name]] == finite_points(rows, metric)
        assert [tuple(p) for p in lines["other_run"]] == finite_points(shifted, metric)
        assert plot.series[metric][tiny_run.name] == tuple(map(list, zip(*finite_points(rows, metric))))


def test_metrics_option_and_unknown_metric(tiny_run):
    plot = plot_runs([tiny_run], ["train/loss"])
    assert list(plot.series) == ["train/loss"] and len(plot.figure.axes[0].get_lines()) == 1
    with pytest.raises(LoongSageError, match=r"--metrics: train/nope not in any run; logged: .*rollout/reward_mean"):
        plot_runs([tiny_run], ["train/nope"])
