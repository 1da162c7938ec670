"""A run sent SIGTERM or SIGINT finishes its step, checkpoints it, and ends.

Schedulers stop a job by sending its driver SIGTERM and kill it a grace period later
(``docker stop``, Kubernetes; both signal the container's main process); ``timeout``, a batch
scheduler's time limit and a terminal's Ctrl-C (SIGINT) signal the driver's whole process group.
Without this, the steps trained since the last checkpoint were lost: Ray's own SIGTERM handler
aborted the driver on the spot, and Ctrl-C ended it with a traceback. Inside ``StopRequest``
the first SIGTERM or SIGINT only asks: the loop finishes the step in progress, saves a
checkpoint of it and raises ``RunStopped``, which names the signal, the step and the resume
command (the CLI prints it and exits with status 2). A second one stops at once
(``KeyboardInterrupt``, without a checkpoint; the CLI says so in one line). One that comes
within ``REPEAT_S`` of the first is the same request: ``timeout`` signals the driver and then
its whole group, the driver included.

A group signal reaches the driver alone: Ray's local daemons run in sessions of their own
(``ray_sessions``) and the reward workers leave the group (``deadline.pool``), so the step can
finish. The handler is in place from the end of the run's start-up (after ``ray.init``, which
sets Ray's own) to its end: a signal during the warm start takes effect after the first RL
step, one during the final evaluation and export lets them finish, and a run asked to stop is
never restarted by ``trainer.auto_resume``. A scheduler that signals every process of the job
itself (Slurm's ``scancel`` through its cgroup) kills the actors too; the step then fails as
any actor death does (``failures.FailureGuard``). Outside the main thread, where Python
cannot handle signals, nothing changes.

Before that, during start-up (``starting``), a SIGINT stops at once: Python's usual
``KeyboardInterrupt``, which the CLI reports in one line. Python drops an exception raised
inside a ``__del__`` (it only prints "Exception ignored"), and start-up runs finalizers of
its imports' objects, so a Ctrl-C landing in one would be lost and the run would go on to
the end; the signal is therefore also remembered, and the run stops when start-up ends.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

from loongsage.controller.failures import RunStopped, resume_command

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
REPEAT_S = 1.0  # a second signal sooner than this after the first is the same request


class StopRequest:
    """Context manager: ``requested`` turns true at the first SIGTERM or SIGINT."""

    def __init__(self) -> None:
        self.signal_name: str | None = None  # the first signal's, once one came
        self._first_at = 0.0
        self._previous: dict[int, Any] = {}
        self._start_up_interrupted = False

    @contextmanager
    def starting(self) -> Iterator[StopRequest]:
        """The span of the run (start-ups included) in which a SIGINT before ``__enter__`` stops at once."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = signal.signal(signal.SIGINT, self._on_start_up_signal)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)

    def _on_start_up_signal(self, signum: int, frame: Any) -> None:
        self._start_up_interrupted = True
        raise KeyboardInterrupt

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def __enter__(self) -> StopRequest:
        if self._start_up_interrupted:  # its KeyboardInterrupt was lost in a finalizer
            raise KeyboardInterrupt
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._on_signal) for signum in STOP_SIGNALS}
        return self

    def __exit__(self, *exc: Any) -> bool:
        for signum, previous in self._previous.items():  # None: a C-level handler, which Python cannot put back
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._previous = {}
        return False

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.requested:
            if time.monotonic() - self._first_at < REPEAT_S:
                return
            raise KeyboardInterrupt(f"a second signal ({name}): stopped at once, without a checkpoint "
                                    "of the step in progress")
        self.signal_name, self._first_at = name, time.monotonic()
        log.warning(f"{name}: finishing the step in progress, then saving a checkpoint of it "
                    "(a second SIGINT or SIGTERM stops at once, without one)")

    def stopped(self, run_dir: Any, step: int) -> RunStopped:
        """The error that ends a run stopped after ``step`` (checkpointed in ``run_dir``)."""
        return RunStopped(f"stopped by {self.signal_name} after step {step}, saved as checkpoint "
                          f"{run_dir.checkpoint_dir(step).name}; {resume_command(run_dir)}")
