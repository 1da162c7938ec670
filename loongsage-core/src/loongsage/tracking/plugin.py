"""Core's built-in tracking plugins, registered through the same hooks as third-party code."""

from loongsage import hookimpl  # noqa: F401
