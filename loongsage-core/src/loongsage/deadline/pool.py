"""Worker processes whose calls run under a deadline that really stops them.

Python cannot interrupt a thread stuck in a CPU-bound loop, or in C code (sympy's big
integer arithmetic on a factorial the model wrote), so a plugin call that must never stall
a run runs in a worker process instead. ``DeadlinePool`` keeps ``workers`` of them
(pebble's ``ProcessPool``): a call that runs past its ``timeout_s`` has its worker
terminated (SIGTERM, then SIGKILL after pebble's 3 s grace) and replaced, and the caller
gets ``CallFailed`` at the deadline, not whenever the call would have ended. The deadline
counts from the moment a worker starts the call; calls wait for a free worker first.

Workers start with ``forkserver``: a fresh interpreter forks them, never this process,
whose torch, Ray and router threads make ``fork`` unsafe (a lock another thread holds at
fork time stays held in the child forever). Modules named in ``preload`` are imported once
by the fork server when this process starts it, so every worker, replacements after a kill
included, starts with them (``benchmarks/reward_pool.py`` measures what that saves). A
worker runs calls in its main thread, so a plugin's own ``SIGALRM`` timeouts (math-verify)
work there. Workers get this process's ``sys.path`` as it is when the pool is built, so a
config-local plugin module importable here is importable there. On Linux a worker is
killed when the fork server exits, which it does when this process ends, however it ends:
a worker stuck in a call is not left spinning after a killed run. Neither the fork server nor
a worker takes a signal meant for this process's group (Ctrl-C, ``timeout``, a scheduler's time
limit): the fork server's first preload (``fork_server_group``) moves it to a process group of
its own, which its workers inherit, so a run asked to stop can still score the step it finishes.

Unlike a plain ``forkserver`` child, a worker does not import this process's main module
(``loongsage.deadline.forkserver_main``, preloaded by the fork server, drops that step), so a
script that starts a run at module level, with no ``if __name__ == "__main__":`` guard, runs
once, as written. Should the workers still die as they start, the pool says so, instead of
every call failing one by one.

A call travels pickled with cloudpickle: module-level functions and classes by reference,
and what a caller registered by value (``cloudpickle.register_pickle_by_value``: a notebook's
reward function, say) with its code.
The worker unpickles it, runs it and pickles the result inside one ``try``, so whatever goes
wrong there (the plugin raises, its module does not import in the worker, its result does
not pickle) comes back as ``CallFailed`` naming the exception and carrying its traceback;
the exception object itself never has to survive pickling.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
import sys
import traceback
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import cloudpickle
import pebble

from loongsage.errors import LoongSageError

FORK_SERVER_GROUP = "loongsage.deadline.fork_server_group"  # by name: importing it here would move this process
FORKSERVER_MAIN = "loongsage.deadline.forkserver_main"  # the fork server's workers skip the main module


class CallFailed(LoongSageError):
    """A pool call gave no result: it ran past its deadline, raised, or its worker died.

    ``reason`` is one line ("timeout after 5 s (worker killed)", "ValueError: bad input");
    ``traceback_text`` is the worker's traceback when the call raised.
    """

    def __init__(self, reason: str, *, timed_out: bool = False, traceback_text: str = "") -> None:
        self.reason, self.timed_out, self.traceback_text = reason, timed_out, traceback_text
        super().__init__(reason)


@dataclass(frozen=True)
class _Raised:
    """What a call raised in the worker, as plain text."""

    reason: str
    traceback_text: str


def _run_pickled(payload: bytes) -> bytes | _Raised:
    """The worker side of a call: unpickle, run, pickle the result, all in one ``try``."""
    try:
        fn, args, kwargs = pickle.loads(payload)
        return pickle.dumps(fn(*args, **kwargs))
    except BaseException as err:  # noqa: BLE001 - everything goes back to the caller as text
        return _Raised(f"{type(err).__name__}: {err}", traceback.format_exc())


def _init_worker(path: list[str]) -> None:
    """Take the controller's ``sys.path``; on Linux, die with the fork server.

    The fork server exits when the last holder of its "alive" pipe does; every forked child
    inherits that pipe, so a worker closes its copy, leaving the controller the only holder:
    the server then ends with the controller, however it ends, and takes its workers along
    (``PR_SET_PDEATHSIG``), a worker stuck in a call included.
    """
    sys.path[:] = path
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if getattr(server, "_forkserver_alive_fd", None) is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def default_workers() -> int:
    """One worker per core this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


class DeadlinePool:
    """``workers`` worker processes (0: ``default_workers()``) running calls with deadlines."""

    def __init__(self, workers: int = 0, preload: Sequence[str] = ()) -> None:
        self.workers = workers or default_workers()
        context = multiprocessing.get_context("forkserver")
        # takes effect if the server is not running yet; the first moves it out of this process's
        # group, the second keeps its workers from importing the main module (both before any plugin)
        own = [FORK_SERVER_GROUP, FORKSERVER_MAIN]
        context.set_forkserver_preload([*own, *sorted(set(preload) - set(own))])
        path = [p or os.getcwd() for p in sys.path]
        self._pool = pebble.ProcessPool(self.workers, initializer=_init_worker, initargs=(path,),
                                        context=context)
        self._closed = False

    async def call(self, timeout_s: float, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in a worker; ``CallFailed`` past ``timeout_s`` or on any failure."""
        try:
            payload = cloudpickle.dumps((fn, args, kwargs))
        except Exception as err:  # noqa: BLE001 - any pickling failure names the object
            reason = f"cannot send the call to a worker process ({type(err).__name__}: {err})"
            raise CallFailed(reason) from None
        if self._closed:
            raise LoongSageError("the worker pool is closed")
        try:
            future = self._pool.schedule(_run_pickled, (payload,), timeout=timeout_s)
        except RuntimeError as err:  # pebble: the pool is broken (its manager threads died)
            raise LoongSageError(f"the worker pool cannot take calls: {err}") from err
        try:
            outcome = await asyncio.wrap_future(future)
        except TimeoutError:
            raise CallFailed(f"timeout after {timeout_s:g} s (worker killed)", timed_out=True) from None
        except pebble.ProcessExpired as err:
            raise CallFailed(f"the worker process died (exit code {err.exitcode})") from None
        except BrokenProcessPool as err:
            raise LoongSageError(
                f"the worker pool broke ({err}): its workers exit as they start (see the traceback above)") from err
        if isinstance(outcome, _Raised):
            raise CallFailed(outcome.reason, traceback_text=outcome.traceback_text)
        try:
            return pickle.loads(outcome)
        except Exception as err:  # noqa: BLE001
            raise CallFailed(f"cannot read the worker's result ({type(err).__name__}: {err})") from None

    def close(self) -> None:
        """Stop every worker now (running calls are abandoned) and wait for them to exit; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._pool.stop()
        self._pool.join()

    def __enter__(self) -> DeadlinePool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
