"""The scheduler's bookkeeping: dispatch, collection, staleness guard and batch assembly.

A pure state machine (no threads, no clocks), so the gate logic can be property-tested
over arbitrary event orders; ``AsyncScheduler`` drives it from an event loop. Every
dispatched group is in exactly one place until it is handed to the trainer:

    running --complete--> finished --collection gate--> buffer --take_batch--> trainer
       ^                                                   |
       +-- waiting (partial rollout paused, or restored from a checkpoint)

Invariants enforced here whatever the window policy says:

* **capacity**: ``R + Q + T <= C`` with ``C = int(B * (1 + S)) + oversample``. ``T`` counts
  groups handed to the trainer whose update has not reached the rollout weights yet, so a
  group is always dispatched at most ``S`` updates before the step that may train it.
* **staleness**: a group dispatched at version ``v`` must be trained by the step of version
  ``v + S'`` (``S' = S + ceil(oversample / B)``). Each batch first takes the groups an
  earliest-deadline-first rule forces, waiting for a forced straggler rather than leaving
  it behind; capacity guarantees the forced set fits in one batch. With one weight update
  per step, every trained token is at most ``S'`` versions old (proof in ``docs/async.md``).
  Deviation from LoongSage: its ``no-window`` policy lets a straggler be overtaken without
  bound; ours keeps ``async.stale_steps`` a hard bound under every policy.
* **liveness**: the oldest uncollected finished group is always collectable.
* **multi-source shares**: with per-step quotas, a batch holds exactly ``quota[source]``
  groups of each source.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

from loongsage.data.types import Group, Prompt, Sample
from loongsage.runtime.window import WindowPolicy, WindowView

RUNNING, FINISHED, WAITING, BUFFERED = "running", "finished", "waiting", "buffered"

Quotas = Union[None, Mapping[str, int], Sequence[Mapping[str, int]]]


@dataclass
class Ticket:
    """One call the driver must make: ``rollout_group(prompt, seq, version[, resume_from])``."""

    seq: int
    prompt: Prompt
    version: int
    resume_from: Optional[Group] = None


@dataclass
class _Entry:
    seq: int
    prompt: Prompt
    dispatch_version: int
    state: str
    group: Optional[Group] = None


def group_to_dict(group: Group) -> dict[str, Any]:
    return dataclasses.asdict(group)


def group_from_dict(data: Mapping[str, Any]) -> Group:
    return Group(
        group_id=data["group_id"],
        prompt=Prompt(**data["prompt"]),
        samples=[Sample(**s) for s in data["samples"]],
        dispatch_version=data["dispatch_version"],
    )


def _aborted(group: Group) -> bool:
    return any(s.awaits_continuation for s in group.samples)


class Pipeline:
    """Bookkeeping of one asynchronous run; see the module docstring for the invariants."""

    def __init__(
        self,
        policy: WindowPolicy,
        batch_size: int,
        stale_steps: int,
        *,
        oversample: int = 0,
        partial: bool = False,
        version: int = 0,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"rollout.prompts_per_step: expected >= 1, got {batch_size}")
        if not isinstance(stale_steps, int) or stale_steps < 0:
            raise ValueError(f"async.stale_steps: expected an integer >= 0 (versions a token may lag), got {stale_steps!r}")
        if oversample < 0:
            raise ValueError(f"rollout.oversample_groups: expected >= 0, got {oversample}")
        self.policy = policy
        self.batch_size = batch_size
        self.stale_steps = stale_steps
        self.oversample = oversample
        self.partial = partial
        self.capacity = int(batch_size * (1 + stale_steps)) + oversample
        self.staleness_bound = stale_steps + math.ceil(oversample / batch_size)
        self.version = version
        self.next_seq = 0
        self.training = 0
        self.paused = False
        self._uncollected: dict[int, _Entry] = {}  # R, in seq order
        self._buffer: dict[int, _Entry] = {}  # Q, in collection order
        self.finished_samples = 0  # every sample whose generation ended (for length bias)
        self.finished_tokens = 0
        self.trained_samples = 0  # every sample handed to the trainer
        self.trained_tokens = 0

    # ------------------------------------------------------------------ views
    def view(self) -> WindowView:
        return WindowView(
            batch_size=self.batch_size,
            stale_steps=self.stale_steps,
            capacity=self.capacity,
            in_flight=len(self._uncollected),
            buffered=len(self._buffer),
            training=self.training,
            next_seq=self.next_seq,
            oldest_uncollected_seq=next(iter(self._uncollected), None),
            version=self.version,
        )

    # --------------------------------------------------------------- dispatch
    def dispatch_budget(self) -> int:
        """How many new groups the driver may dispatch now (0 while paused)."""
        if self.paused:
            return 0
        view = self.view()
        return max(0, min(int(self.policy.dispatch_count(view)), view.free))

    def dispatch(self, prompt: Prompt) -> Ticket:
        if self.paused or self.view().free <= 0:
            raise RuntimeError("dispatch past the window: the capacity or a pause forbids it")
        seq = self.next_seq
        self.next_seq += 1
        self._uncollected[seq] = _Entry(seq, prompt, self.version, RUNNING)
        self.policy.on_dispatched(seq)
        return Ticket(seq, prompt, self.version)

    def take_waiting(self) -> list[Ticket]:
        """Re-dispatch every waiting group (paused partials continue from their tokens)."""
        if self.paused:
            return []
        tickets = []
        for entry in self._uncollected.values():
            if entry.state != WAITING:
                continue
            entry.state = RUNNING
            if entry.group is None:  # restored from a checkpoint with no tokens: start over
                entry.dispatch_version = self.version
            tickets.append(Ticket(entry.seq, entry.prompt, self.version, entry.group))
        return tickets

    # ------------------------------------------------------------- completion
    def complete(self, seq: int, group: Group) -> None:
        """A rollout call returned. Aborted groups wait for re-dispatch under partial rollout."""
        entry = self._uncollected.get(seq)
        if entry is None or entry.state != RUNNING:
            raise RuntimeError(f"group {seq} completed but is not running (duplicate result?)")
        if group.group_id != seq:
            raise ValueError(f"rollout_group returned group_id {group.group_id} for group {seq}")
        group.dispatch_version = entry.dispatch_version
        entry.group = group
        if self.partial and _aborted(group):
            entry.state = WAITING
            return
        entry.state = FINISHED
        self.finished_samples += len(group.samples)
        self.finished_tokens += sum(len(s.response_ids) for s in group.samples)

    def collect(self) -> list[int]:
        """Apply the collection gate in seq order; return the seqs that entered the buffer."""
        collected = []
        for seq in list(self._uncollected):
            entry = self._uncollected[seq]
            if entry.state != FINISHED:
                continue
            oldest = next(iter(self._uncollected)) == seq
            if not oldest and not self.policy.may_collect(seq, self.view()):
                continue
            del self._uncollected[seq]
            entry.state = BUFFERED
            self._buffer[seq] = entry
            self.policy.on_collected(seq)
            collected.append(seq)
        return collected

    # ----------------------------------------------------------------- batches
    def deadline(self, entry: _Entry) -> int:
        """The last version whose step may train this group: ``dispatch_version + S'``."""
        return entry.dispatch_version + self.staleness_bound

    def forced(self, entries: list[_Entry], quota_ahead: Sequence[int]) -> list[_Entry]:
        """The groups this step must train so no group ever misses its deadline.

        Earliest-deadline-first: with ``N(w)`` untrained groups due by version ``w`` and
        ``quota_ahead[j]`` groups of theirs trained ``j`` steps from now, the batch must take
        ``max_w N(w) - sum(quota_ahead[1 .. w - v])`` of the earliest-deadline ones (buffered
        ones first among equal deadlines, so the trainer waits as little as possible).
        Capacity keeps that at most ``quota_ahead[0]``.
        """
        order = sorted(entries, key=lambda e: (self.deadline(e), e.state != BUFFERED, e.seq))
        must = due = 0
        for i, entry in enumerate(order):
            due += 1
            last_of_deadline = i + 1 == len(order) or self.deadline(order[i + 1]) != self.deadline(entry)
            if last_of_deadline:
                later = self.deadline(entry) - self.version
                room = sum(quota_ahead[min(j, len(quota_ahead) - 1)] for j in range(1, later + 1))
                must = max(must, due - room)
        return order[: min(must, quota_ahead[0])]

    def take_batch(self, quotas: Quotas = None) -> Optional[list[Group]]:
        """Hand the trainer one batch, or ``None`` if it must wait.

        ``quotas``: ``None`` (one stream of ``B``), one ``{source: count}`` for every step,
        or a list of them for this step and the next ones (``quotas[j]`` is step + j's; the
        last repeats). Per source: the groups the staleness guard forces (waiting for any
        that has not reached the buffer), then buffered groups in collection order (first
        finishers first).
        """
        chosen: list[int] = []
        for source, ahead in self._plan(quotas).items():
            need = ahead[0]
            mine = [
                e for pool in (self._uncollected, self._buffer) for e in pool.values()
                if source is None or e.prompt.source == source
            ]
            forced = self.forced(mine, ahead)
            if any(e.state != BUFFERED for e in forced):
                return None
            picked = [e.seq for e in forced]
            for entry in self._buffer.values():
                if len(picked) >= need:
                    break
                if entry.seq not in picked and (source is None or entry.prompt.source == source):
                    picked.append(entry.seq)
            if len(picked) < need:
                return None
            chosen.extend(picked)
        batch = [self._buffer.pop(seq).group for seq in sorted(chosen)]
        self.training += len(batch)
        self.trained_samples += sum(len(g.samples) for g in batch)
        self.trained_tokens += sum(len(s.response_ids) for g in batch for s in g.samples)
        return batch

    def _plan(self, quotas: Quotas) -> dict[Optional[str], list[int]]:
        """``{source: [quota now, quota next step, ...]}`` after checking every step's quotas."""
        if quotas is None:
            return {None: [self.batch_size]}
        steps = [quotas] if isinstance(quotas, Mapping) else list(quotas)
        if not steps:
            raise ValueError("scheduler quotas: expected at least this step's per-source counts")
        for j, step in enumerate(steps):
            if any(not isinstance(n, int) or n < 0 for n in step.values()):
                raise ValueError(f"scheduler quotas (step +{j}): expected non-negative ints per source, got {dict(step)}")
            if sum(step.values()) != self.batch_size:
                raise ValueError(
                    f"scheduler quotas (step +{j}): per-source counts {dict(step)} sum to "
                    f"{sum(step.values())}, expected the batch size {self.batch_size}"
                )
        sources = [s for s, n in steps[0].items() if n > 0]
        return {s: [step.get(s, 0) for step in steps] for s in sources}

    # ----------------------------------------------------------- weight updates
    def pause(self) -> None:
        """Stop dispatching until the next weight update."""
        self.paused = True

    def on_weights_updated(self, version: int) -> None:
        if version < self.version:
            raise ValueError(f"weight version went back from {self.version} to {version}")
        self.version = version
        self.training = 0
        self.paused = False

    # ------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        """Everything dispatched and not yet trained, with the tokens generated so far.

        A running call cannot be saved: its group is saved as waiting, with the tokens of
        its last pause if it had one, and is re-dispatched on resume (from scratch when it
        had none, continuing from those tokens otherwise).
        """
        def save(entry: _Entry) -> dict[str, Any]:
            return {
                "seq": entry.seq,
                "prompt": dataclasses.asdict(entry.prompt),
                "dispatch_version": entry.dispatch_version,
                "state": WAITING if entry.state == RUNNING else entry.state,
                "group": group_to_dict(entry.group) if entry.group is not None else None,
            }

        return {
            "version": self.version,
            "next_seq": self.next_seq,
            "training": self.training,
            "paused": self.paused,
            "uncollected": [save(e) for e in self._uncollected.values()],
            "buffer": [save(e) for e in self._buffer.values()],
            "finished_samples": self.finished_samples,
            "finished_tokens": self.finished_tokens,
            "trained_samples": self.trained_samples,
            "trained_tokens": self.trained_tokens,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        def load(d: Mapping[str, Any]) -> _Entry:
            group = group_from_dict(d["group"]) if d["group"] is not None else None
            return _Entry(d["seq"], Prompt(**d["prompt"]), d["dispatch_version"], d["state"], group)

        self.version = state["version"]
        self.next_seq = state["next_seq"]
        self.training = state["training"]
        self.paused = state["paused"]
        self._uncollected = {d["seq"]: load(d) for d in sorted(state["uncollected"], key=lambda d: d["seq"])}
        self._buffer = {d["seq"]: load(d) for d in state["buffer"]}
        self.finished_samples = state["finished_samples"]
        self.finished_tokens = state["finished_tokens"]
        self.trained_samples = state["trained_samples"]
        self.trained_tokens = state["trained_tokens"]
        self.policy.on_reset()
        for seq in self._uncollected:
            self.policy.on_dispatched(seq)
