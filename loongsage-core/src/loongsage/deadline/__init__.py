"""Deadline-bound execution of plugin code that must not stall a run.

``pool.DeadlinePool``: worker processes whose calls are killed at their deadline (rewards).
``budget.Budget``: a time budget for calls that stay in-process (dataset readers, data
filters); past it the caller gets an error naming the plugin instead of waiting forever.
"""
