"""Registrations of loongsage-distill: only hook implementations, cheap to import (no torch)."""

from loongsage import hookimpl  # noqa: F401
