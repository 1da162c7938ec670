"""Curves of one or more runs from their ``metrics.jsonl``, drawn with matplotlib (Agg).

One panel per metric, one line per run, so several runs overlay for comparison. The default
panels are the ones that say something on a default run: reward, greedy eval accuracy, the
policy's entropy, response length, step time and the train/inference mismatch
(``train/is_approx_k3_kl``, in log scale: on a healthy run it sits near 1e-14, a flat zero on a
linear axis). ``train/ppo_kl`` is not among them: with one optimizer step per batch it is 0.
Defaults a run never logged are left out, an explicitly asked-for metric (``--metrics``) that no
run has is an error naming the metrics there are. ``plot_runs`` returns the figure and the exact series it
drew, so callers (and tests) can check what is on the picture; ``run_curves`` gives the same series
undrawn, for the viewer's interactive chart (``loongsage view``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from loongsage.errors import LoongSageError
from loongsage.tracking.jsonl import read_metrics

DEFAULT_METRICS = (
    "rollout/reward_mean",
    "eval/correct_mean",
    "train/entropy",
    "rollout/response_length_mean",
    "timing/step",
    "train/is_approx_k3_kl",
)
LOG_SCALE = frozenset({"train/is_approx_k3_kl"})  # drawn in log scale when they have a positive value
COLUMNS = 2


@dataclass
class Plot:
    """A drawn figure and its data: ``series[metric][run_label] = (steps, values)``."""

    figure: object
    series: dict[str, dict[str, tuple[list[int], list[float]]]] = field(default_factory=dict)

    def save(self, path: str | Path, dpi: int = 100) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.figure.savefig(path, dpi=dpi)
        return path


def run_label(run_dir: Path, others: Sequence[Path]) -> str:
    """The folder name, or the shortest distinguishing tail of the path when names repeat."""
    names = [p.name for p in others]
    if names.count(run_dir.name) == 1:
        return run_dir.name
    return str(Path(*run_dir.parts[-2:]))


def metric_series(rows: list[dict], metric: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``metric``: rows that logged a finite value for it, by step."""
    points = sorted((int(r["step"]), float(r[metric])) for r in rows
                    if isinstance(r.get(metric), (int, float)) and math.isfinite(r[metric]))
    return [s for s, _ in points], [v for _, v in points]


def load_runs(run_dirs: Sequence[str | Path]) -> dict[str, list[dict]]:
    """Each run's metric rows keyed by its label; a folder without metrics is an error."""
    paths = [Path(p) for p in run_dirs]
    out = {}
    for path in paths:
        rows = read_metrics(path / "metrics.jsonl")
        if not rows:
            raise LoongSageError(f"{path}: no metrics.jsonl with any row (is it a run directory?)")
        out[run_label(path, paths)] = rows
    return out


def choose_metrics(runs: dict[str, list[dict]], metrics: Sequence[str] | None) -> list[str]:
    logged = sorted({k for rows in runs.values() for r in rows for k in r if "/" in k})
    if not metrics:
        chosen = [m for m in DEFAULT_METRICS if m in logged]
        return chosen or logged[:COLUMNS * 3]
    unknown = [m for m in metrics if m not in logged]
    if unknown:
        raise LoongSageError(f"--metrics: {', '.join(unknown)} not in any run; logged: {', '.join(logged)}")
    return list(metrics)


@dataclass
class Curves:
    """The chosen metrics of some runs: ``series[metric][run_label] = (steps, values)``."""

    series: dict[str, dict[str, tuple[list[int], list[float]]]]

    def log_scale(self, metric: str) -> bool:
        """Drawn in log scale: a ``LOG_SCALE`` metric with a positive value."""
        return metric in LOG_SCALE and any(v > 0 for _, values in self.series[metric].values() for v in values)

    def as_json(self) -> dict:
        """What the viewer's interactive chart draws (``/api/curves``)."""
        runs = list(next(iter(self.series.values()), {}))
        return {"runs": runs, "metrics": [{"name": m, "log": self.log_scale(m),
                                           "series": {label: [list(s), list(v)] for label, (s, v) in by_run.items()}}
                                          for m, by_run in self.series.items()]}


def run_curves(run_dirs: Sequence[str | Path], metrics: Sequence[str] | None = None) -> Curves:
    """Every chosen metric of every run (module docstring), not drawn."""
    runs = load_runs(run_dirs)
    return Curves({metric: {label: metric_series(rows, metric) for label, rows in runs.items()}
                   for metric in choose_metrics(runs, metrics)})


def plot_runs(run_dirs: Sequence[str | Path], metrics: Sequence[str] | None = None) -> Plot:
    """Draw every chosen metric of every run; see the module docstring."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    curves = run_curves(run_dirs, metrics)
    rows_n = math.ceil(len(curves.series) / COLUMNS)
    cols = min(COLUMNS, len(curves.series))
    figure = Figure(figsize=(5.5 * cols, 3.2 * rows_n), layout="constrained")
    axes = figure.subplots(rows_n, cols, squeeze=False).ravel()
    for axis, (metric, by_run) in zip(axes, curves.series.items()):
        for label, (steps, values) in by_run.items():
            axis.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=label)
        if curves.log_scale(metric):
            axis.set_yscale("log")
        axis.set_title(metric)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
        if len(by_run) > 1:
            axis.legend(fontsize="small")
    for axis in axes[len(curves.series):]:
        axis.set_visible(False)
    return Plot(figure, curves.series)
