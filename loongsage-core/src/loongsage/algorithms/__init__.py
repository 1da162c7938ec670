"""Algorithms."""
