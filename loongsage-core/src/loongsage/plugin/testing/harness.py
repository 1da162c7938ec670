"""Registries and a model for a plugin's own tests, built the way a run builds them.

``installed_registries()`` are the process-wide registries of every installed distribution
(loaded once, as ``loongsage train`` loads them); ``registries_with(plugin, ...)`` builds
fresh registries with run-time plugins added (a module or an object with ``@hookimpl``
methods), so a test registers a plugin without installing it; ``tiny_model()`` is the
seeded tiny causal LM core's own tests train (built once into a cache folder, no download).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def installed_registries() -> Any:
    """The registries of every installed plugin distribution, loaded once per process."""
    from loongsage.plugins import get_registries

    return get_registries()


def registries_with(*plugins: object) -> Any:
    """Fresh, frozen registries: the installed distributions plus ``plugins`` (run-time plugins)."""
    from loongsage.plugins import load_plugins

    return load_plugins(extra=[(p, f"runtime_plugin_{i}") for i, p in enumerate(plugins)])


def tiny_model(cache_dir: str | Path | None = None) -> Path:
    """The folder of the seeded tiny causal LM (with its tokenizer), built on first use."""
    from loongsage.models.tiny import ensure_tiny_model

    return ensure_tiny_model(cache_dir)
