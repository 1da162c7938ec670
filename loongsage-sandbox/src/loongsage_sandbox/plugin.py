"""Registrations of loongsage-sandbox: only hook implementations, cheap to import (no torch)."""

from loongsage import hookimpl  # noqa: F401
