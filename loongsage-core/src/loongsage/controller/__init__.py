"""The single controller: builds every component from the config and runs the loop.

``run_training`` and ``run_sft_only`` load on first use: Ray actors import this package for
``controller.actors`` and must not pay for the whole controller (config, agent routers, the
AgentFlow server: about 1.5 s of each actor's start on a slow core).
"""

from __future__ import annotations

from typing import Any

__all__ = ["run_training", "run_sft_only"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from loongsage.controller import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
