"""Core's built-in trackers, registered through the same hook as third-party trackers."""

from loongsage import hookimpl
from loongsage.tracking.console import ConsoleParams
from loongsage.tracking.jsonl import JsonlParams


@hookimpl
def loongsage_register_trackers(register):
    register("console", "loongsage.tracking.console:ConsoleTracker", params=ConsoleParams)
    register("jsonl", "loongsage.tracking.jsonl:JsonlTracker", params=JsonlParams)
