"""Weights & Biases tracker: offline by default, online once the user has logged in.

``mode: auto`` runs online when an API key is found (``WANDB_API_KEY``, or the ``~/.netrc``
entry that ``wandb login`` writes) and offline otherwise, so a run never blocks on a login
prompt; an offline run lands under ``<run_dir>/wandb`` and ``wandb sync`` uploads it later.
``WANDB_MODE`` in the environment wins over ``mode``. The run's resolved config is the W&B
config; metric names (``section/name``) are W&B keys, so the sections become panels. W&B's
own service process writes the offline log: ``finish()`` returns before the last records are
on disk (about a second later).
Needs the ``wandb`` package (extra ``loongsage-core[wandb]``).
"""

from __future__ import annotations

import netrc
import os
from dataclasses import dataclass, field
from typing import List, Mapping, Optional
from urllib.parse import urlparse

from loongsage.tracking.base import SAMPLE_COLUMNS, Tracker
from loongsage.tracking.optional import finite, require

MODES = ("auto", "online", "offline", "disabled")


@dataclass
class WandbParams:
    """Log to Weights & Biases (offline unless logged in)."""

    project: str = "loongsage"  # W&B project of the run
    entity: Optional[str] = None  # W&B user or team; None = the logged-in default
    run_name: Optional[str] = None  # default: the run directory's name
    mode: str = "auto"  # auto | online | offline | disabled
    tags: List[str] = field(default_factory=list)  # tags of the W&B run

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        require("wandb", "wandb")


def logged_in() -> bool:
    """Whether W&B credentials exist: ``WANDB_API_KEY`` or a netrc entry for the W&B host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def resolve_mode(mode: str) -> str:
    """``WANDB_MODE`` if set, else ``mode``, with ``auto`` meaning online only when logged in."""
    chosen = os.environ.get("WANDB_MODE") or mode
    if chosen == "auto":
        return "online" if logged_in() else "offline"
    return chosen


class WandbTracker(Tracker):
    """One W&B history row per step."""

    def __init__(self, params, run_dir, config) -> None:
        super().__init__(params, run_dir, config)
        import wandb

        self.mode = resolve_mode(params.mode)
        self._run = wandb.init(
            project=params.project, entity=params.entity, name=params.run_name or self.run_dir.name,
            tags=list(params.tags), config=dict(config), dir=str(self.run_dir), mode=self.mode,
            settings=wandb.Settings(silent=True, console="off"),
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log(dict(finite(metrics)), step=step)

    def log_samples(self, rows: list[list], step: int) -> None:
        """The samples as a W&B table, key ``samples``."""
        import wandb

        self._run.log({"samples": wandb.Table(columns=list(SAMPLE_COLUMNS), data=rows)}, step=step)

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
