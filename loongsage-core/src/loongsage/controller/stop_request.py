"""A run sent SIGTERM finishes its step, checkpoints it, and ends.

Schedulers stop a job by sending its driver SIGTERM and kill it a grace period later
(``docker stop``, Kubernetes; both signal the container's main process). Without this, the
steps trained since the last checkpoint were lost: Ray's own SIGTERM handler aborts the
driver on the spot. Inside ``StopRequest`` the first SIGTERM only asks: the loop finishes the
step in progress, saves a checkpoint of it and raises ``RunStopped``, which names the step
and the resume command (the CLI prints it and exits with status 2). A second SIGTERM stops
at once (``KeyboardInterrupt``, without a checkpoint). The handler is in place from the end of
the run's start-up (after ``ray.init``, which sets Ray's own) to its end: a SIGTERM during the
warm start takes effect after the first RL step, one during the final evaluation and export
lets them finish, and a run asked to stop is never restarted by ``trainer.auto_resume``.

Ctrl-C is left as it was (an immediate stop): a terminal sends SIGINT to the whole foreground
process group, which holds Ray's GCS and raylet, so the step could not finish anyway. A
scheduler that signals every process of the job (Slurm) kills the actors too; the step then
fails as any actor death does (``failures.FailureGuard``). Outside the main thread, where
Python cannot handle signals, nothing changes.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from loongsage.controller.failures import RunStopped, resume_command

log = logging.getLogger(__name__)


class StopRequest:
    """Context manager: ``requested`` turns true at the first SIGTERM."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._installed = True
        return self

    def __exit__(self, *exc: Any) -> bool:
        if self._installed:  # None: a C-level handler, which Python cannot put back
            signal.signal(signal.SIGTERM, signal.SIG_DFL if self._previous is None else self._previous)
            self._installed = False
        return False

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt("a second SIGTERM: stopping now, without a checkpoint")
        self.requested = True
        log.warning("SIGTERM: finishing the step in progress, then saving a checkpoint of it "
                    "(a second SIGTERM stops at once, without one)")

    def stopped(self, run_dir: Any, step: int) -> RunStopped:
        """The error that ends a run stopped after ``step`` (checkpointed in ``run_dir``)."""
        return RunStopped(f"stopped by SIGTERM after step {step}, saved as checkpoint "
                          f"{run_dir.checkpoint_dir(step).name}; {resume_command(run_dir)}")
