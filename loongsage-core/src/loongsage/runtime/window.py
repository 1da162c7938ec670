"""Window policies: the two gates of the asynchronous scheduler.

A window policy answers two questions for the scheduler's pipeline
(``loongsage.runtime.pipeline``):

* **dispatch gate** -- ``dispatch_count(view)``: how many more prompt groups may start now;
* **collection gate** -- ``may_collect(seq, view)``: may the finished group with dispatch
  sequence number ``seq`` enter the buffer the trainer draws batches from?

Symbols (baidu-baige/LoongSage `docs/en/fully-async-mode.md`): ``B`` prompt groups per step,
``S`` = ``async.stale_steps``, capacity ``C = int(B * (1 + S))`` (plus oversampled groups),
``R`` dispatched and not yet collected, ``Q`` collected and buffered, ``T`` taken for the
step being trained and not yet reflected in the rollout weights, ``seq`` = dispatch order.

The pipeline enforces three things whatever the policy says, so a custom policy can only be
*stricter*: capacity (``R + Q + T <= C``), the staleness bound (see ``pipeline``), and
liveness (the oldest uncollected group may always be collected, so no policy can deadlock
the trainer). A user's policy subclasses ``WindowPolicy`` and overrides any of its five
methods; ``docs/async.md`` shows how to register one from a separate package.

This module is torch-free and cheap to import (``plugin.py`` imports the parameter types).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class WindowView:
    """What a policy sees when asked: the pipeline's counters at that moment."""

    batch_size: int  # B
    stale_steps: int  # S
    capacity: int  # C
    in_flight: int  # R: dispatched, not collected (running, finished at the gate, or paused)
    buffered: int  # Q: collected, waiting for a training batch
    training: int  # T: taken for the current step, weights not yet updated
    next_seq: int  # the seq the next dispatched group will get
    oldest_uncollected_seq: Optional[int]  # min seq among the R groups (None when R == 0)
    version: int  # current policy (weight) version

    @property
    def free(self) -> int:
        """Capacity left: ``C - R - Q - T`` (never negative)."""
        return max(0, self.capacity - self.in_flight - self.buffered - self.training)


class WindowPolicy:
    """Base window policy: dispatch up to capacity, collect any finished group.

    Subclass and override what you need. ``params`` is the instance of the parameter
    dataclass registered with the policy (``None`` when it registered none). The
    ``on_*`` hooks let a policy keep its own state; after a resume the pipeline calls
    ``on_reset()`` and then ``on_dispatched(seq)`` for every restored uncollected group,
    in seq order, so that state can be rebuilt.
    """

    def __init__(self, params: Any = None) -> None:
        self.params = params

    def dispatch_count(self, view: WindowView) -> int:
        """How many more groups may be dispatched now (clamped to ``view.free``)."""
        return view.free

    def may_collect(self, seq: int, view: WindowView) -> bool:
        """May finished group ``seq`` enter the training buffer now?"""
        return True

    def on_dispatched(self, seq: int) -> None:
        """Group ``seq`` was dispatched."""

    def on_collected(self, seq: int) -> None:
        """Group ``seq`` entered the training buffer."""

    def on_reset(self) -> None:
        """The pipeline was restored from a checkpoint; forget per-group state."""


@dataclass
class NoWindowParams:
    """Parameters of `no_window` (none: its only bound is the capacity)."""


@dataclass
class WindowGatedParams:
    """Parameters of `window_gated`."""

    window: int = 0  # dispatch window in groups; 0 = the capacity C (LoongSage's choice)


@dataclass
class WindowedFifoParams:
    """Parameters of `windowed_fifo`."""

    skew: int = 0  # collection order skew bound in groups; 0 = one batch B (LoongSage's choice)


class NoWindow(WindowPolicy):
    """Dispatch up to capacity; train on whichever groups finish first."""


class WindowGated(WindowPolicy):
    """Dispatch only while the newest group is within a window of the oldest uncollected one.

    A straggler therefore stalls dispatch: ``next_seq - oldest_uncollected_seq < W``
    (``W = params.window`` or the capacity ``C``), so at most ``W`` consecutive groups are
    ever outstanding around it.
    """

    def dispatch_count(self, view: WindowView) -> int:
        window = (self.params.window if self.params is not None else 0) or view.capacity
        if view.oldest_uncollected_seq is None:
            return view.free
        return max(0, min(view.free, view.oldest_uncollected_seq + window - view.next_seq))


class WindowedFifo(WindowPolicy):
    """Collect a finished group only if it is fewer than ``K`` seqs after the oldest uncollected.

    ``K = params.skew`` or the batch size ``B``: groups enter training in dispatch order up
    to a skew of one batch, which keeps a long rollout from being overtaken indefinitely.
    """

    def may_collect(self, seq: int, view: WindowView) -> bool:
        skew = (self.params.skew if self.params is not None else 0) or view.batch_size
        oldest = view.oldest_uncollected_seq
        return oldest is None or seq - oldest < skew
