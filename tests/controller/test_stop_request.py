"""``StopRequest``: the first SIGTERM or SIGINT only sets ``requested`` (the loop finishes its
step), a second one stops at once unless it repeats the first within ``REPEAT_S`` (``timeout``
signals the driver, then its group), and the handlers that were there before are back
afterwards. The end-to-end runs are tests/e2e/test_sigterm.py."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from loongsage.controller import stop_request
from loongsage.controller.run_dir import RunDirectory
from loongsage.controller.stop_request import StopRequest


def test_first_sigterm_asks_a_second_stops_and_the_old_handlers_come_back(monkeypatch):
    monkeypatch.setattr(stop_request, "REPEAT_S", 0.0)
    seen = []
    before = {signum: signal.signal(signum, lambda signum, _: seen.append(signal.Signals(signum).name))
              for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        with pytest.raises(KeyboardInterrupt, match=r"a second signal \(SIGINT\): stopped at once"):
            with StopRequest() as stop:
                assert not stop.requested
                os.kill(os.getpid(), signal.SIGTERM)
                assert stop.requested and stop.signal_name == "SIGTERM" and seen == []
                os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        assert seen == ["SIGTERM", "SIGINT"]
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_sigint_asks_like_sigterm_and_an_immediate_repeat_is_the_same_request(tmp_path: Path):
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # timeout(1): the driver, then its whole group
        assert stop.requested and stop.signal_name == "SIGINT"
        time.sleep(stop_request.REPEAT_S)
        with pytest.raises(KeyboardInterrupt, match="second signal"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)  # the handler runs between bytecodes
    run_dir = RunDirectory(tmp_path)
    assert str(stop.stopped(run_dir, 3)) == (f"stopped by SIGINT after step 3, saved as checkpoint step_000003; "
                                             f"resume with trainer.resume=true trainer.run_dir={tmp_path}")


class SignalsInItsFinalizer:
    """Ctrl-C landing in a finalizer: Python prints the KeyboardInterrupt raised there and drops it."""

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)
        sum(range(1000))  # the handler runs between bytecodes, still inside __del__


def test_a_sigint_during_start_up_stops_at_once_even_when_a_finalizer_swallowed_it():
    before = signal.getsignal(signal.SIGINT)
    stop = StopRequest()
    with stop.starting():
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
        SignalsInItsFinalizer()  # dropped at once; its interrupt is lost, start-up goes on
        with pytest.raises(KeyboardInterrupt):
            with stop:
                pytest.fail("the run must not start after a Ctrl-C during its start-up")
        assert not stop.requested
    assert signal.getsignal(signal.SIGINT) is before


def test_start_up_without_a_signal_enters_the_step_handler_and_puts_it_back_after():
    stop = StopRequest()
    with stop.starting():
        start_up_handler = signal.getsignal(signal.SIGINT)
        with stop:
            os.kill(os.getpid(), signal.SIGINT)
            assert stop.requested
        assert signal.getsignal(signal.SIGINT) == start_up_handler
