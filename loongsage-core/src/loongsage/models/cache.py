"""Build a model folder once into the cache, safely under concurrent callers.

Each caller builds into a private temporary folder beside the target and renames it into
place; a caller that loses the race keeps the winner's folder and drops its own.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def build_once(final: Path, build: Callable[[Path], object]) -> Path:
    """Return ``final``, running ``build(tmp_folder)`` and renaming it there if needed."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-build-", dir=final.parent))
    os.chmod(tmp, 0o755)
    try:
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
