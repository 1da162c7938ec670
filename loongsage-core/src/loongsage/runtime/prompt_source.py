"""Adapts a batch-drawing mixer to the scheduler's one-prompt-at-a-time source with quotas.

The DataMixer draws whole batches (``next_prompts(B)``, per-source counts in
``last_counts``); the asynchronous scheduler dispatches one group at a time and must know
each step's per-source quota, for the current step and the next ``S'`` ones (its staleness
guard plans deadlines per source). ``BatchedPromptSource`` draws chunk ``k`` of ``B``
prompts for step ``k`` and hands its prompts out in order; asking for a future step's quota
draws ahead, which is harmless because the drawn prompts wait in order in the queue.

Per-mini-batch and per-rank shares of the mixer's layout do not survive any out-of-order
schedule (groups finish in any order); a batch keeps its exact per-source counts, so the
trainer can re-split it by source (``loongsage.data.mixer.wrap_split``).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any, Mapping, Protocol

from loongsage.data.types import Prompt


KEEP_PAST = 64  # steps of quotas kept behind the latest asked (the scheduler asks ahead only)


class BatchMixer(Protocol):
    last_counts: dict[str, int]

    def next_prompts(self, n: int) -> list[Prompt]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class BatchedPromptSource:
    """``next_prompt()`` and ``quotas(step)`` over a mixer drawing ``batch_size`` per step."""

    def __init__(self, mixer: BatchMixer, batch_size: int, first_step: int = 0) -> None:
        self.mixer = mixer
        self.batch_size = batch_size
        self._queue: deque[Prompt] = deque()
        self._chunks: list[dict[str, int]] = []  # quotas of steps first_step, first_step + 1, ...
        self._first_step = first_step

    def _draw(self) -> None:
        prompts = self.mixer.next_prompts(self.batch_size)
        counts = dict(self.mixer.last_counts)
        if sum(counts.values()) != len(prompts) or len(prompts) != self.batch_size:
            raise ValueError(f"mixer drew {len(prompts)} prompts with counts {counts}, expected {self.batch_size}")
        self._queue.extend(prompts)
        self._chunks.append(counts)

    def next_prompt(self) -> Prompt:
        if not self._queue:
            self._draw()
        return self._queue.popleft()

    def quotas(self, step: int) -> dict[str, int]:
        """Per-source counts of step ``step``'s batch (the last ``KEEP_PAST`` steps stay known)."""
        if step < self._first_step:
            raise ValueError(f"quotas for step {step}: only steps from {self._first_step} are kept")
        while step >= self._first_step + len(self._chunks):
            self._draw()
        current = self._chunks[step - self._first_step]
        drop = max(0, step - KEEP_PAST - self._first_step)
        del self._chunks[:drop]
        self._first_step += drop
        return dict(current)

    def state_dict(self) -> dict[str, Any]:
        return {
            "mixer": self.mixer.state_dict(),
            "queue": [dataclasses.asdict(p) for p in self._queue],
            "chunks": [dict(c) for c in self._chunks],
            "first_step": self._first_step,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.mixer.load_state_dict(state["mixer"])
        self._queue = deque(Prompt(**p) for p in state["queue"])
        self._chunks = [dict(c) for c in state["chunks"]]
        self._first_step = state["first_step"]
