"""LoongSage sandboxes: bubblewrap, process, docker and remote backends with pooling.

Other packages obtain a backend through the registry (``registries.sandbox.get("bwrap")``, or
as the data source's ``sandbox``); the names below are for code that depends on this package
directly.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Sandbox": "loongsage_sandbox.base",
    "ExecResult": "loongsage_sandbox.base",
    "FileEntry": "loongsage_sandbox.base",
    "SandboxPool": "loongsage_sandbox.pool",
    "SandboxParams": "loongsage_sandbox.params",
    "SandboxError": "loongsage_sandbox.errors",
    "SandboxUnavailableError": "loongsage_sandbox.errors",
    "SandboxCrashedError": "loongsage_sandbox.errors",
    "SandboxClosedError": "loongsage_sandbox.errors",
    "UntrustedCodeRefusedError": "loongsage_sandbox.errors",
    "cleanup_leftovers": "loongsage_sandbox.leftovers",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:  # lazy: importing the package stays cheap
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'loongsage_sandbox' has no attribute {name!r}")
