"""``StopRequest``: the first SIGTERM only sets ``requested`` (the loop finishes its step), a
second one stops at once, and the handler that was there before is back afterwards. The
end-to-end run is tests/e2e/test_sigterm.py."""

from __future__ import annotations

import os
import signal

import pytest

from loongsage.controller.stop_request import StopRequest


def test_first_sigterm_asks_a_second_stops_and_the_old_handler_comes_back():
    seen = []
    before = signal.signal(signal.SIGTERM, lambda *_: seen.append("old handler"))
    try:
        with pytest.raises(KeyboardInterrupt, match="second SIGTERM"):
            with StopRequest() as stop:
                assert not stop.requested
                os.kill(os.getpid(), signal.SIGTERM)
                assert stop.requested and seen == []
                os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == ["old handler"]
    finally:
        signal.signal(signal.SIGTERM, before)
