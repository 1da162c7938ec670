"""Datasets: prompt sources built as ``cls(params, seed)`` with ``__len__`` and ``get(index)``."""
