"""Time budgets for plugin calls that run in-process: dataset readers and data filters.

These calls stay in the controller (a dataset hands out prompts, a filter receives and
returns the step's groups), where moving them into worker processes would pickle whole
datasets and batches for no gain: they are not fed model output the way rewards are.
A stalled one must still not freeze the run without a word, so ``Budget.run`` runs the call
on a daemon thread and waits at most ``seconds``; past that it raises ``BudgetExceeded``
naming the plugin and the config key of the budget. ``Budget.run_each`` does the same for
many calls on one thread (the start-up prompt check reads every record: a thread per read
cost ten times the read itself), each call still within ``seconds``. Python cannot stop a thread, so the
stuck call is abandoned, not killed: it dies with the process, which the error ends.
What the call raises within its budget is re-raised as it is.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from loongsage.errors import LoongSageError


class BudgetExceeded(LoongSageError):
    """An in-process plugin call ran past its time budget."""

    def __init__(self, what: str, seconds: float, key: str) -> None:
        self.what, self.seconds, self.key = what, seconds, key
        super().__init__(
            f"{what} did not return within its {seconds:g} s budget ({key}); the call is "
            f"abandoned and the run stops here: fix the plugin or raise {key}"
        )


@dataclass(frozen=True)
class Budget:
    """At most ``seconds`` per call (``None``: no limit, the call runs in the caller's thread);
    ``key`` is the config key that sets it, for the error."""

    seconds: float | None
    key: str = ""

    def run(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, or ``BudgetExceeded`` naming ``what`` once ``seconds`` have passed."""
        if self.seconds is None:
            return fn(*args)
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = fn(*args)
            except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
                box["error"] = err

        thread = threading.Thread(target=target, name=f"budget: {what}", daemon=True)
        thread.start()
        thread.join(self.seconds)
        if thread.is_alive():
            raise BudgetExceeded(what, self.seconds, self.key)
        if "error" in box:
            raise box["error"]
        return box["value"]


    def run_each(self, what: Callable[[Any], str], fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """``fn(item)`` for every item, in order, on one daemon thread; an ``Exception`` a call
        raises is returned in its result's place (the caller names the item). A call still
        running ``seconds`` after it started raises ``BudgetExceeded`` naming ``what(item)``."""
        if self.seconds is None:
            return [_result(fn, item) for item in items]
        results: list[Any] = []
        progress = [(None, time.monotonic())]  # (item in progress, when it started), replaced whole

        def target() -> None:
            for item in items:
                progress[0] = (item, time.monotonic())
                results.append(_result(fn, item))

        thread = threading.Thread(target=target, name="budget: each", daemon=True)
        thread.start()
        while True:
            current = progress[0]
            thread.join(max(0.0, current[1] + self.seconds - time.monotonic()))
            if not thread.is_alive():
                break
            if progress[0] is current and time.monotonic() - current[1] >= self.seconds:
                raise BudgetExceeded(what(current[0]), self.seconds, self.key)
        if len(results) < len(items):  # a BaseException (not an Exception) ended the thread
            raise RuntimeError(f"{what(progress[0][0])} ended its thread without returning")
        return results


def _result(fn: Callable[[Any], Any], item: Any) -> Any:
    try:
        return fn(item)
    except Exception as err:  # noqa: BLE001 - handed back in the result's place
        return err


UNLIMITED = Budget(None)  # for sources and filter chains built outside a run (tests, tools)
