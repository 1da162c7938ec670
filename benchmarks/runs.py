"""Running ``loongsage`` commands from benchmarks: their environment and a shared warm start.

Every benchmark run gets a local cluster of its own (never an outside ``RAY_ADDRESS``) and
passive OpenMP waits unless the caller chose otherwise (a spinning wait would be counted as
work). A benchmark whose rows or sides must start from the same weights (``async_modes.py``'s
rows, ``vs_trl.py``'s two frameworks) runs the recipe's own warm start once and hands each of
them the saved model folder; those runs then skip their warm start (``trainer.sft.steps=0``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_env() -> dict[str, str]:
    """This process's environment for a benchmark's ``loongsage`` run (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("RAY_AUTH_MODE", "disabled")
    return env


def warm_start(recipe: str, out: Path) -> Path:
    """Run ``loongsage sft`` on ``recipe`` into ``out``; return the saved model folder."""
    cmd = [sys.executable, "-m", "loongsage.cli", "sft", "--config-name", recipe,
           f"trainer.run_dir={out}", "logging.progress_bar=false"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=run_env())
    if done.returncode != 0:
        raise RuntimeError(f"warm start of {recipe} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return out / "sft_model"
