"""Runtime."""
