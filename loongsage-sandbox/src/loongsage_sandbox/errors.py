"""Errors raised by sandboxes; each says what failed and what to do about it."""

from __future__ import annotations

from loongsage.plugin import LoongSageError


class SandboxError(LoongSageError):
    """A sandbox operation failed; ``kind`` is a stable label (``path_escape``, ``not_found``...)."""

    def __init__(self, message: str, kind: str = "error"):
        super().__init__(message)
        self.kind = kind


class SandboxUnavailableError(SandboxError):
    """The backend cannot run here (bwrap or docker missing, service unreachable)."""

    def __init__(self, message: str):
        super().__init__(message, "unavailable")


class UntrustedCodeRefusedError(SandboxError):
    """The ``process`` backend was asked to run untrusted code without explicit permission."""

    def __init__(self, message: str):
        super().__init__(message, "untrusted_refused")


class SandboxCrashedError(SandboxError):
    """The sandbox's supervisor died or stopped answering; the sandbox is unusable."""

    def __init__(self, message: str):
        super().__init__(message, "crashed")


class SandboxClosedError(SandboxError):
    """An operation was attempted on a sandbox that is closed (or never started)."""

    def __init__(self, message: str):
        super().__init__(message, "closed")
