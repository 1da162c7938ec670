"""Router errors; each wire adapter renders them in its own error format."""

from __future__ import annotations

from loongsage.errors import LoongSageError


class RequestError(LoongSageError):
    """A client request the router refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.kind, self.param = message, status, kind, param


class EngineError(LoongSageError):
    """The engine failed while serving a turn; the trajectory is marked failed."""
