"""Registrations of loongsage-algos: only hook implementations, cheap to import (no torch)."""

from loongsage import hookimpl  # noqa: F401
