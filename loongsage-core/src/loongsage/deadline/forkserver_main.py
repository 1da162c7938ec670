"""Imported by the reward pool's fork server only: its workers never import the main module.

A ``forkserver`` (or ``spawn``) child imports its parent's main module before it runs
anything (``multiprocessing.spawn.prepare`` reads ``init_main_from_path``), so that a target
defined in ``__main__`` can be unpickled. The reward pool never needs that: its target lives in
``loongsage.deadline.pool`` and every call travels pickled with cloudpickle, which sends what
``__main__`` defines by value. Importing the main module is then only harm: a plain script that
calls ``loongsage.train`` at module level, with no ``if __name__ == "__main__":`` guard, would
start a whole second run in every worker.

``DeadlinePool`` names this module in the fork server's preload list, so the fork server (a
fresh interpreter, never the caller's) imports it at start and every worker it forks, a
replacement after a kill included, prepares without the main module. Importing it anywhere else
would change how that process's own ``spawn`` children start: nothing else imports it.
"""

from __future__ import annotations

from multiprocessing import spawn

MAIN_MODULE_KEYS = ("init_main_from_path", "init_main_from_name")
_prepare = spawn.prepare


def prepare_without_main(data: dict) -> None:
    """``spawn.prepare`` minus the import of the parent's main module."""
    _prepare({key: value for key, value in data.items() if key not in MAIN_MODULE_KEYS})


spawn.prepare = prepare_without_main
