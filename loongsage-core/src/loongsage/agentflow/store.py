"""TrajectoryStore: token-in/token-out trajectories as flat arrays plus index-only segments.

One ``Trajectory`` per (trajectory_id, attempt_id) holds four position-aligned arrays:
``tokens``, ``loss_mask`` (1 only on tokens the model sampled), ``logprobs`` (the rollout
engine's logprob of each sampled token, 0.0 elsewhere) and ``versions`` (the weight version
that sampled each token, -1 elsewhere). Turns never copy tokens: a ``Segment`` is a list of
``(start, end)`` spans into those arrays. A segment usually has one span; it gets more when
requests of several segments interleave (a subagent running while its parent waits) and a
forked segment's first span points into its parent's tokens (shared prefix, not trained
twice). On an MoE model a fifth array, ``routes``, holds each token's routed experts
(``[layers, top_k]`` rows in ``loongsage.engines.routing``'s record format, None where none is
known): a request's routes cover its whole prompt and output, so the newest request of a
segment rewrites the routes of the positions it covers (the routing its own tokens were sampled
under, across turns and resumed partial rollouts; a fork rewrites its shared prefix too).

Origins follow baidu-baige/LoongSage (``root``, ``compact``, ``subagent``) with one deviation:
baidu-baige/LoongSage keeps subagent segments as untrained placeholders, here every segment with
sampled tokens becomes its own training ``Sample``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from loongsage.data.types import Sample

ORIGINS = ("root", "compact", "subagent")


@dataclass
class Segment:
    """One conversation inside a trajectory, as index spans into the trajectory's arrays."""

    segment_id: int
    origin: str  # root | compact | subagent
    parent: int | None
    spans: list[list[int]] = field(default_factory=list)  # [start, end) pairs, in order
    shared_len: int = 0  # leading tokens borrowed from the parent (prompt, never trained here)
    prompt_len: int = 0  # tokens before the first sampled token (shared prefix + first prompt)
    messages: list[dict[str, Any]] = field(default_factory=list)  # internal messages held so far
    # segment length after each message that is a sampled turn, -1 after the others
    message_ends: list[int] = field(default_factory=list)
    tools_key: str = ""  # canonical tools JSON the segment was rendered with
    trainable: bool = True  # False: side calls kept for inspection, never a Sample (e.g. titles)
    finish_reason: str = "stop"
    num_turns: int = 0

    def __post_init__(self) -> None:
        if self.origin not in ORIGINS:
            raise ValueError(f"Segment.origin must be one of {ORIGINS}, got {self.origin!r}")

    @property
    def start(self) -> int:
        return self.spans[0][0] if self.spans else 0

    @property
    def end(self) -> int:
        return self.spans[-1][1] if self.spans else 0

    def __len__(self) -> int:
        return sum(e - s for s, e in self.spans)

    def indices(self) -> Iterator[int]:
        for s, e in self.spans:
            yield from range(s, e)

    def to_json(self) -> dict[str, Any]:
        return {
            "segment_id": self.segment_id, "origin": self.origin, "parent": self.parent,
            "start": self.start, "end": self.end, "spans": [list(s) for s in self.spans],
            "shared_len": self.shared_len, "prompt_len": self.prompt_len,
            "num_turns": self.num_turns, "finish_reason": self.finish_reason,
            "num_messages": len(self.messages), "trainable": self.trainable,
            "messages": self.messages,  # the conversation: tool calls and tool results included
        }


@dataclass
class Trajectory:
    """All tokens one agent attempt exchanged with the model, and its segments."""

    trajectory_id: str
    attempt_id: str
    tokens: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    routes: list[Any] = field(default_factory=list)  # numpy [layers, top_k] per token, or None
    segments: list[Segment] = field(default_factory=list)
    active_segment: int | None = None
    status: str = "active"  # active | finished | failed
    error: str | None = None
    reward: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    # the rollout's sampling parameters; when set, trained turns use them whatever the client
    # asks (``messages.enforce_sampling``); metadata counts the turns and fields it changed
    sampling: dict[str, Any] | None = None
    created: float = field(default_factory=time.time)

    @property
    def key(self) -> tuple[str, str]:
        return (self.trajectory_id, self.attempt_id)

    def new_segment(self, origin: str, parent: int | None, shared: tuple[int, int] | None = None,
                    trainable: bool = True) -> Segment:
        """Open a segment; ``shared`` = a span of the parent's tokens it continues from.

        A mainline segment (root, compact) becomes the active one; subagent and untrainable
        segments never do.
        """
        seg = Segment(segment_id=len(self.segments), origin=origin, parent=parent,
                      trainable=trainable)
        if shared is not None and shared[1] > shared[0]:
            seg.spans.append([shared[0], shared[1]])
            seg.shared_len = shared[1] - shared[0]
        self.segments.append(seg)
        if origin != "subagent" and trainable:
            self.active_segment = seg.segment_id
        return seg

    def append(self, seg: Segment, ids: list[int], *, sampled: bool,
               logprobs: list[float] | None = None, versions: list[int] | None = None) -> None:
        """Append tokens to the flat arrays and extend ``seg`` to cover them."""
        if not ids:
            return
        if sampled and (logprobs is None or len(logprobs) != len(ids)):
            got = None if logprobs is None else len(logprobs)
            raise ValueError(f"sampled tokens need one logprob each: {len(ids)} ids, "
                             f"{got} logprobs")
        start = len(self.tokens)
        self.tokens.extend(ids)
        self.loss_mask.extend([1 if sampled else 0] * len(ids))
        self.logprobs.extend(logprobs if sampled else [0.0] * len(ids))
        if sampled and versions is not None and len(versions) != len(ids):
            raise ValueError(f"sampled tokens need one weight version each: {len(ids)} ids, "
                             f"{len(versions)} versions")
        if not sampled:
            versions = [-1] * len(ids)
        self.versions.extend(versions if versions is not None else [0] * len(ids))
        self.routes.extend([None] * len(ids))
        if seg.spans and seg.spans[-1][1] == start:
            seg.spans[-1][1] = len(self.tokens)
        else:
            seg.spans.append([start, len(self.tokens)])
        if sampled and seg.prompt_len == 0:
            seg.prompt_len = len(seg) - len(ids)

    def rollback(self, seg: Segment, seg_len: int, n_messages: int) -> bool:
        """Undo a failed turn's prompt tokens when they are the newest tokens; True if undone."""
        extra = len(seg) - seg_len
        if extra <= 0 or not seg.spans or seg.spans[-1][1] != len(self.tokens) or \
                seg.spans[-1][1] - seg.spans[-1][0] < extra:
            return False
        cut = len(self.tokens) - extra
        for arr in (self.tokens, self.loss_mask, self.logprobs, self.versions, self.routes):
            del arr[cut:]
        seg.spans[-1][1] = cut
        if seg.spans[-1][0] == cut:
            seg.spans.pop()
        del seg.messages[n_messages:]
        del seg.message_ends[n_messages:]
        return True

    def record_routes(self, seg: Segment, routes: Any) -> None:
        """Write a request's routes (``[prompt + output tokens, layers, top_k]``, the segment's
        tokens from its first on) over the positions they cover; rows without a record are skipped."""
        recorded = (routes >= 0).all(axis=(1, 2))
        for i, row, known in zip(seg.indices(), routes, recorded):
            if known:
                self.routes[i] = row

    def sample_routes(self, idx: list[int]) -> Any:
        """The routes of positions ``idx`` as ``[len(idx), layers, top_k]``; None when none is known."""
        known = next((self.routes[i] for i in idx if self.routes[i] is not None), None)
        if known is None:
            return None
        blank = np.full_like(known, -1)
        return np.stack([self.routes[i] if self.routes[i] is not None else blank for i in idx])

    def segment_tokens(self, seg: Segment) -> list[int]:
        return [self.tokens[i] for i in seg.indices()]

    def prefix_span_at(self, seg: Segment, count: int) -> list[list[int]]:
        """The spans holding the first ``count`` tokens of ``seg`` (for forking)."""
        out, left = [], count
        for s, e in seg.spans:
            if left <= 0:
                break
            take = min(e - s, left)
            out.append([s, s + take])
            left -= take
        return out

    def to_samples(self, reward: float | None = None) -> list[Sample]:
        """One ``Sample`` per segment that holds sampled tokens, in segment order."""
        reward = self.reward if reward is None else reward
        samples = []
        for seg in self.segments:
            if not seg.trainable:
                continue
            idx = list(seg.indices())
            prompt_n = seg.prompt_len
            if not any(self.loss_mask[i] for i in idx[prompt_n:]):
                continue
            # the shared prefix belongs to the parent's sample: never trained twice
            resp = idx[prompt_n:]
            # tokens between sampled turns carry the version of the turn before them, so a
            # sample's versions say which policies it saw (Group.min_version) and never -1
            versions, last = [], self.versions[resp[0]]
            for i in resp:
                last = self.versions[i] if self.loss_mask[i] else last
                versions.append(last)
            samples.append(Sample(
                prompt_ids=[self.tokens[i] for i in idx[:prompt_n]],
                response_ids=[self.tokens[i] for i in resp],
                response_logprobs=[self.logprobs[i] for i in resp],
                weight_versions=versions,
                loss_mask=[self.loss_mask[i] for i in resp],
                finish_reason="abort" if self.status == "failed" else seg.finish_reason,
                reward=float(reward or 0.0),
                reward_info={"trajectory_id": self.trajectory_id, "attempt_id": self.attempt_id,
                             "segment_id": seg.segment_id, "origin": seg.origin,
                             "parent": seg.parent, "sampling_overridden_turns":
                                 self.metadata.get("sampling_overridden_turns", 0),
                             "continued_turns": self.metadata.get("continued_turns", 0),
                             "turn_retries": self.metadata.get("turn_retries", 0)},
                routed_experts=self.sample_routes(idx),
            ))
        return samples

    def to_json(self) -> dict[str, Any]:
        return {
            "trajectory_id": self.trajectory_id, "attempt_id": self.attempt_id,
            "status": self.status, "error": self.error, "reward": self.reward,
            "active_segment": self.active_segment,
            "tokens": self.tokens, "loss_mask": self.loss_mask,
            "logprobs": self.logprobs, "versions": self.versions,
            "segments": [s.to_json() for s in self.segments],
            "metadata": self.metadata,
        }


class TrajectoryStore:
    """Trajectories by (trajectory_id, attempt_id); finished ones can be persisted as JSON lines."""

    def __init__(self, run_dir: str | Path | None = None, auto_create: bool = False) -> None:
        self._items: dict[tuple[str, str], Trajectory] = {}
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.auto_create = auto_create

    def open(self, trajectory_id: str, attempt_id: str = "0", **metadata: Any) -> Trajectory:
        """Create (or return the existing) trajectory for this key."""
        key = (str(trajectory_id), str(attempt_id))
        traj = self._items.get(key)
        if traj is None:
            traj = self._items[key] = Trajectory(*key, metadata=dict(metadata))
        return traj

    def lookup(self, trajectory_id: str, attempt_id: str = "0") -> Trajectory | None:
        """The trajectory for a request: None when unknown and auto-creation is off."""
        key = (str(trajectory_id), str(attempt_id))
        if key not in self._items and self.auto_create:
            return self.open(*key)
        return self._items.get(key)

    def attempts(self, trajectory_id: str) -> list[Trajectory]:
        items = list(self._items.items())  # other threads may open trajectories meanwhile
        return [t for (tid, _), t in items if tid == str(trajectory_id)]

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[Trajectory]:
        return iter(list(self._items.values()))

    def __len__(self) -> int:
        return len(self._items)

    def finish(self, trajectory_id: str, attempt_id: str = "0", reward: float | None = None,
               drop: bool = True, error: str | None = None) -> list[Sample]:
        """Close a trajectory, persist it to the run directory, and return its samples.

        ``error`` (why it failed: its agent program raised or was cancelled, a model call or
        its sandbox failed) closes it as failed with that reason, unless a turn already failed
        it with its own."""
        key = (str(trajectory_id), str(attempt_id))
        traj = self._items.get(key)
        if traj is None:
            raise KeyError(f"unknown trajectory {key[0]!r} attempt {key[1]!r}")
        if error is not None and traj.status != "failed":
            traj.status, traj.error = "failed", error
        elif traj.status == "active":
            traj.status = "finished"
        if reward is not None:
            traj.reward = reward
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with open(self.run_dir / "trajectories.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps(traj.to_json()) + "\n")
        if drop:
            del self._items[key]
        return traj.to_samples()

    def record_reward(self, trajectory_id: str, attempt_id: str, reward: float,
                      info: dict[str, Any] | None = None) -> None:
        """Append a finished trajectory's reward to ``run_dir/rewards.jsonl``.

        Trajectories are persisted the moment they finish, so none is lost if scoring fails;
        their rewards come later (the reward runs on the agent's final answer) and are joined
        on ``(trajectory_id, attempt_id)``. ``info`` keeps the reward's numeric fields.
        """
        if self.run_dir is None:
            return
        row = {"trajectory_id": str(trajectory_id), "attempt_id": str(attempt_id),
               "reward": float(reward),
               "info": {k: v for k, v in (info or {}).items() if isinstance(v, (bool, int, float))}}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / "rewards.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
