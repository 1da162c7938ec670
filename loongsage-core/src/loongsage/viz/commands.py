"""``loongsage plot`` and ``loongsage view``: command plugins of core, like ``models``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence


def plot_main(argv: Sequence[str], registries: Any = None) -> int:
    """``loongsage plot RUN_DIR [RUN_DIR ...] [--metrics M ...] [-o out.png]``."""
    from loongsage.viz.plot import DEFAULT_METRICS, plot_runs

    parser = argparse.ArgumentParser(prog="loongsage plot",
                                     description="Draw runs' curves from their metrics.jsonl to a PNG.")
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories (overlaid)")
    parser.add_argument("--metrics", "-m", nargs="+", default=None,
                        help=f"metrics to draw (default: those of {', '.join(DEFAULT_METRICS)} logged)")
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="PNG to write (default: RUN_DIR/curves.png of the first run)")
    parser.add_argument("--dpi", type=int, default=100)
    args = parser.parse_args(list(argv))
    plot = plot_runs(args.run_dirs, args.metrics)
    out = plot.save(args.output or args.run_dirs[0] / "curves.png", dpi=args.dpi)
    print(out)
    return 0


def view_main(argv: Sequence[str], registries: Any = None) -> int:
    """``loongsage view RUN_DIR [--compare RUN_DIR ...] [--host 127.0.0.1] [--port 8765]``: the
    trajectory viewer."""
    from loongsage.viz.server import serve_viewer

    parser = argparse.ArgumentParser(prog="loongsage view",
                                     description="Serve the trajectory viewer page over a run directory.")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--compare", nargs="+", type=Path, default=[],
                        help="other run directories whose curves are overlaid on this run's")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    args = parser.parse_args(list(argv))
    serve_viewer(args.run_dir, args.host, args.port, args.compare)
    return 0
