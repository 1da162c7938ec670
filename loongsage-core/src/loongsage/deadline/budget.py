"""Time budgets for plugin calls that run in-process: dataset readers and data filters.

These calls stay in the controller (a dataset hands out prompts, a filter receives and
returns the step's groups), where moving them into worker processes would pickle whole
datasets and batches for no gain: they are not fed model output the way rewards are.
A stalled one must still not freeze the run without a word, so ``Budget.run`` runs the call
on a daemon thread and waits at most ``seconds``; past that it raises ``BudgetExceeded``
naming the plugin and the config key of the budget. Python cannot stop a thread, so the
stuck call is abandoned, not killed: it dies with the process, which the error ends.
What the call raises within its budget is re-raised as it is.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

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


UNLIMITED = Budget(None)  # for sources and filter chains built outside a run (tests, tools)
