"""Errors raised while loading plugins and validating configuration.

Each error names what a user needs to fix it: the config key, the plugin kind, the
distributions involved, and, for an unknown name, the closest registered one and, when a
sibling distribution that is not loaded provides it, which one (``loongsage.catalogue``).
"""

from __future__ import annotations

import difflib

from loongsage.catalogue import install_hint


class LoongSageError(Exception):
    """Base class of every error LoongSage raises on purpose.

    Picklable whatever a subclass's constructor takes: Ray sends an error raised in an actor
    to the caller by pickling it, and the default reduction calls the constructor with the
    formatted message alone, which fails for ``ConfigError(key, problem)`` and the like (the
    caller then gets Ray's ``UnserializableException`` instead of the error).
    """

    def __reduce__(self):
        return _rebuild_error, (type(self), self.args, self.__dict__)


def _rebuild_error(cls: type, args: tuple, state: dict) -> LoongSageError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class ConfigError(LoongSageError, ValueError):
    """A configuration value is invalid; the message starts with the offending key."""

    def __init__(self, key: str, problem: str):
        self.key = key
        self.problem = problem
        super().__init__(f"{key}: {problem}")


class DuplicatePluginError(LoongSageError):
    """Two registrations claim the same name within one kind."""

    def __init__(self, kind: str, name: str, first: str, second: str):
        self.kind, self.name, self.first, self.second = kind, name, first, second
        super().__init__(
            f"{kind} '{name}' is registered twice: by distribution '{first}' and by "
            f"distribution '{second}'. Names are unique per kind; rename one of them."
        )


class UnknownPluginError(LoongSageError, KeyError):
    """A config names a plugin that no loaded distribution registered."""

    def __init__(self, kind: str, name: str, key: str, available: dict[str, str]):
        self.kind, self.name, self.key, self.available = kind, name, key, available
        match = difflib.get_close_matches(str(name), list(available), n=1, cutoff=0.5)
        self.closest = match[0] if match else None
        listing = ", ".join(f"{n} ({d})" for n, d in sorted(available.items())) or "none"
        hint = f" Did you mean '{self.closest}'?" if self.closest else ""
        self.install_hint = install_hint(kind, str(name))
        super().__init__(
            f"{key}: unknown {kind} '{name}'.{hint} Registered {kind} names: {listing}.{self.install_hint}"
        )

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return self.args[0]


class PluginImportError(LoongSageError, ImportError):
    """A plugin module named by an entry point or a config failed to import."""

    def __init__(self, source: str, module: str, traceback_text: str):
        self.source, self.module, self.traceback_text = source, module, traceback_text
        super().__init__(
            f"plugin module '{module}' from {source} failed to import:\n{traceback_text}"
        )


class RegistryFrozenError(LoongSageError):
    """Registration was attempted after the registries were frozen."""


class NonFiniteLossError(LoongSageError, FloatingPointError):
    """A training loss or gradient was NaN or infinite; the step was not taken.

    ``terms`` names the loss terms / metrics that were not finite (``train/pg_loss``, ...),
    or the parameters whose gradient was not; ``step`` is the optimizer step it would have been.
    """

    def __init__(self, what: str, terms: dict[str, float], step: int):
        self.what, self.terms, self.step = what, terms, step
        listing = ", ".join(f"{name}={value}" for name, value in terms.items()) or "none reported"
        super().__init__(
            f"non-finite {what} at optimizer step {step}: {listing}. The step was not taken and "
            "the weights are unchanged; look for an extreme log-ratio or a reward/advantage that "
            "is not finite"
        )
