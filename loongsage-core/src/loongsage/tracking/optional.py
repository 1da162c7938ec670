"""The optional packages behind the tensorboard, wandb and mlflow trackers.

Each tracker is an extra of loongsage-core (its hint: ``pip install 'tensorboard>=2.14'``);
its parameter dataclass calls ``require`` when the config is validated, so a run naming a
tracker whose package is missing stops before any actor starts, with the command that fixes it.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any, Iterator, Mapping

from loongsage.install_hints import extra_command


def require(module: str, extra: str) -> None:
    """Raise ``ValueError`` (a ConfigError once validation adds the key) if ``module`` is absent."""
    if importlib.util.find_spec(module) is None:
        raise ValueError(f"the {extra} tracker needs the '{module}' package: "
                         f"{extra_command('loongsage-core', extra)}")


def finite(metrics: Mapping[str, float]) -> Iterator[tuple[str, float]]:
    """The metrics with a finite numeric value (non-finite ones stay in metrics.jsonl as null)."""
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and math.isfinite(value):
            yield key, float(value)


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 1e-3}}`` -> ``{"train.lr": 1e-3}``; lists stay values."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out
