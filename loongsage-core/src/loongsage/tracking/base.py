"""The tracker contract: built as ``cls(params, run_dir, config)``; ``log`` per step; ``close``.

Metric names follow ``section/name`` (``rollout/reward_mean``, ``timing/step``). Trackers
only receive plain floats and ints; the controller has already reduced tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping


class Tracker:
    """Base class for trackers; subclasses override ``log`` and optionally ``close``."""

    def __init__(self, params: Any, run_dir: Path, config: Mapping[str, Any]) -> None:
        self.params = params
        self.run_dir = Path(run_dir)
        self.config = config

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Flush and release resources."""
