"""LoongSage: agent-native, fully asynchronous RL post-training for LLMs.

The public plugin API is ``loongsage.hookimpl`` plus the documented base types; see
``docs/plugins.md``.
"""

from loongsage.hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = ["hookimpl", "__version__"]
