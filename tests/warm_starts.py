"""Warm starts built once and reused: ``loongsage sft`` outputs cached by what produced them.

End-to-end tests that start from a supervised warm start (the code-repair recipe's 100 steps,
the distillation teachers) ask :func:`warm_start` for its ``sft_model`` folder instead of
running ``loongsage sft`` themselves. The folder lives in ``$LOONGSAGE_CACHE/test-warm-starts``
under a key of the recipe, its overrides, the library versions and the content of every source
file of the five distributions, so a change to the code that trains it builds it anew, and an
unchanged tree (a second test module, the next session on the same machine) reuses it. A file
lock makes concurrent test processes (pytest-xdist workers) build each key once.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from loongsage.models.tiny import default_cache_root

REPO = Path(__file__).resolve().parents[1]
SOURCE_SUFFIXES = {".py", ".yaml", ".json", ".jinja"}


def source_digest(root: Path = REPO) -> str:
    """A hash of every source and recipe file of the five distributions and the libraries'
    versions that decide what a warm start trains."""
    import tokenizers
    import torch
    import transformers

    h = hashlib.sha256(f"{torch.__version__}|{transformers.__version__}|{tokenizers.__version__}".encode())
    for path in sorted(root.glob("loongsage-*/src/**/*")):
        if path.suffix in SOURCE_SUFFIXES and path.is_file():
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def cached(name: str, key_parts: tuple[str, ...], build: Callable[[Path], object],
           cache_root: Path | None = None) -> Path:
    """The folder ``build(folder)`` fills, built once per key under an exclusive file lock.

    ``cache_root``: ``$LOONGSAGE_CACHE`` by default (kept across sessions); a test session's
    shared temporary folder (``tmp_path_factory.getbasetemp().parent``) for what one session's
    xdist workers share and nobody keeps."""
    root = (cache_root or default_cache_root()) / "test-warm-starts"
    root.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256("\0".join(key_parts).encode()).hexdigest()[:16]
    final = root / f"{name}-{key}"
    with open(root / f"{name}-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if not (final / "done").exists():  # built in place (paths inside stay true); a
            shutil.rmtree(final, ignore_errors=True)  # half-built folder of a killed build goes
            final.mkdir()
            build(final)
            (final / "done").touch()
    return final


def warm_start(recipe: str, *overrides: str, env: dict[str, str] | None = None,
               timeout: float = 900) -> Path:
    """The ``sft_model`` folder of ``loongsage sft --config-name recipe overrides``."""

    def sft(out: Path) -> None:
        args = [sys.executable, "-m", "loongsage.cli", "sft", "--config-name", recipe,
                f"trainer.run_dir={out}", "logging.progress_bar=false", *overrides]
        result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"loongsage sft {recipe} {' '.join(overrides)} failed:\n{result.stderr[-3000:]}")

    name = recipe.replace("/", "-")
    return cached(name, (recipe, *overrides, source_digest()), sft) / "sft_model"
