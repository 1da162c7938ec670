"""The ``loongsage`` loggers' one console handler: progress on stdout, level from ``-v``/``-q``.

Library code logs through ``logging.getLogger(__name__)`` and never prints; an entry point
(the CLI, ``loongsage.train``) calls ``configure_logging`` once. Messages are bare (a run's
progress is the program's output), INFO by default, WARNING with ``-q``, DEBUG with ``-v``,
and written with ``tqdm.write`` so that a progress bar, when one is shown, stays below them.
"""

from __future__ import annotations

import logging
import sys

ROOT = "loongsage"


class _StdoutHandler(logging.Handler):
    """Writes each record to the ``sys.stdout`` of the moment (pytest's capture swaps it)."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=sys.stdout)
            sys.stdout.flush()
        except Exception:
            self.handleError(record)


def configure_logging(verbosity: int = 0) -> logging.Logger:
    """Install the handler once and set the level: ``verbosity`` < 0 quiet, > 0 debug."""
    logger = logging.getLogger(ROOT)
    if not any(isinstance(h, _StdoutHandler) for h in logger.handlers):
        handler = _StdoutHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.WARNING if verbosity < 0 else logging.DEBUG if verbosity > 0 else logging.INFO)
    logger.propagate = False
    return logger
