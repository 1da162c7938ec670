"""LoongSage: agent-native, fully asynchronous RL post-training for LLMs.

The public plugin API is ``loongsage.plugin`` (``docs/plugins.md``); ``loongsage.hookimpl`` is
the same marker as ``loongsage.plugin.hookimpl``. ``loongsage.train(recipe, overrides,
reward=fn)`` trains from Python (``loongsage.api``), imported on first use so that plugin
modules importing ``hookimpl`` stay cheap.
"""

from loongsage.hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = ["hookimpl", "train", "__version__"]


def __getattr__(name: str):
    if name in ("train", "TrainResult"):
        from loongsage import api

        return getattr(api, name)
    raise AttributeError(f"module 'loongsage' has no attribute {name!r}")
