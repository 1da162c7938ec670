"""Typed configuration: schema, Hydra composition, validation."""
