"""Property tests: every window policy's bounds hold over randomised schedules.

The rollouts are simulated (``sim.py``): the point is the gate logic, and hypothesis needs
thousands of completion orders per minute. Each drawn example runs the real ``Pipeline``
through a random interleaving of token decoding, completions, training steps, weight
updates, partial-rollout pauses and crash/resume from ``state_dict``, and checks after
every event: capacity never exceeded, collection skew within the FIFO bound, dispatch
span within the gated window, every trained token at most ``S'`` versions old, each batch
holding each source's exact quota, and no group lost or trained twice.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loongsage.runtime.pipeline import Pipeline
from loongsage.runtime.window import WindowPolicy, WindowView
from runtime_sim import SimGroup, dispatched, make_source, start_group, window_policy

N_SAMPLES = 2


class Recorder(WindowPolicy):
    """Wraps a policy and keeps its own account of uncollected seqs to check the bounds."""

    def __init__(self, inner: WindowPolicy) -> None:
        super().__init__(inner.params)
        self.inner = inner
        self.uncollected: set[int] = set()
        self.max_collect_skew = 0
        self.max_dispatch_span = 0

    def dispatch_count(self, view: WindowView) -> int:
        return self.inner.dispatch_count(view)

    def may_collect(self, seq: int, view: WindowView) -> bool:
        return self.inner.may_collect(seq, view)

    def on_dispatched(self, seq: int) -> None:
        if self.uncollected:
            self.max_dispatch_span = max(self.max_dispatch_span, seq - min(self.uncollected) + 1)
        self.uncollected.add(seq)
        self.inner.on_dispatched(seq)

    def on_collected(self, seq: int) -> None:
        self.max_collect_skew = max(self.max_collect_skew, seq - min(self.uncollected))
        self.uncollected.remove(seq)
        self.inner.on_collected(seq)

    def on_reset(self) -> None:
        self.uncollected.clear()
        self.inner.on_reset()


@dataclass
class Config:
    policy: str
    batch_size: int
    stale_steps: int
    oversample: int
    partial: bool
    weights: dict[str, float]
    steps: int
    crash_steps: frozenset[int]
    seed: int


@dataclass
class Run:
    """One simulated run; ``trained`` survives crashes (it is what the optimizer saw)."""

    cfg: Config
    rng: random.Random
    trained_seqs: list[int] = field(default_factory=list)
    trained_prompts: list[tuple[str, int]] = field(default_factory=list)
    batches: list[list[int]] = field(default_factory=list)
    max_staleness: int = 0
    max_capacity_use: int = 0
    recorders: list[Recorder] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.source = make_source(self.cfg.batch_size, self.cfg.weights, seed=self.cfg.seed)
        self.pipe = self._new_pipeline()
        self.running: dict[int, SimGroup] = {}

    def _new_pipeline(self) -> Pipeline:
        recorder = Recorder(window_policy(self.cfg.policy))
        self.recorders.append(recorder)
        return Pipeline(recorder, self.cfg.batch_size, self.cfg.stale_steps,
                        oversample=self.cfg.oversample, partial=self.cfg.partial)

    def check(self) -> None:
        view = self.pipe.view()
        used = view.in_flight + view.buffered + view.training
        assert used <= self.pipe.capacity
        self.max_capacity_use = max(self.max_capacity_use, used)

    def pump(self) -> None:
        self.pipe.collect()
        for t in self.pipe.take_waiting():
            self.running[t.seq] = start_group(t.prompt, t.seq, t.version, N_SAMPLES, t.resume_from)
        for _ in range(self.pipe.dispatch_budget()):
            t = self.pipe.dispatch(self.source.next_prompt())
            self.running[t.seq] = start_group(t.prompt, t.seq, t.version, N_SAMPLES)
        self.check()

    def decode_event(self) -> None:
        seq = self.rng.choice(sorted(self.running))
        group = self.running[seq]
        group.advance(self.rng.choice([1, 3, 8, 30, 200]))
        if group.done():
            del self.running[seq]
            self.pipe.complete(seq, group.result())
        self.pump()

    def step(self) -> None:
        while True:
            self.pump()
            step = len(self.batches)
            quotas = [self.source.quotas(step + j) for j in range(self.pipe.staleness_bound + 1)]
            batch = self.pipe.take_batch(quotas)
            if batch is not None:
                break
            assert self.running, "stalled: the trainer waits and nothing is running"
            self.decode_event()
        self.record(batch, quotas[0])
        for _ in range(self.rng.randrange(4)):  # rollout overlaps the train step
            if self.running:
                self.decode_event()
        self.pipe.pause()
        if self.cfg.partial:  # abort: every running call returns what it has
            for seq, group in sorted(self.running.items()):
                self.pipe.complete(seq, group.result())
            self.running.clear()
        self.pipe.on_weights_updated(self.pipe.version + 1)

    def record(self, batch, quota: dict[str, int]) -> None:
        version = self.pipe.version
        assert len(batch) == self.cfg.batch_size
        counts: dict[str, int] = {}
        for g in batch:
            counts[g.prompt.source] = counts.get(g.prompt.source, 0) + 1
            assert all(s.finish_reason == "stop" for s in g.samples)
            for s in g.samples:
                assert all(v <= version for v in s.weight_versions)
                self.max_staleness = max([self.max_staleness] + [version - v for v in s.weight_versions])
        assert counts == {k: v for k, v in quota.items() if v}
        self.batches.append([g.group_id for g in batch])
        self.trained_seqs += [g.group_id for g in batch]
        self.trained_prompts += [(g.prompt.source, g.prompt.index) for g in batch]

    def crash_and_resume(self) -> None:
        state = {"pipe": self.pipe.state_dict(), "source": self.source.state_dict()}
        self.source = make_source(self.cfg.batch_size, self.cfg.weights, seed=self.cfg.seed)
        self.source.load_state_dict(state["source"])
        self.pipe = self._new_pipeline()
        self.pipe.load_state_dict(state["pipe"])
        self.running = {}  # the in-flight calls died with the process

    def pending_seqs(self) -> list[int]:
        s = self.pipe.state_dict()
        return [e["seq"] for e in s["uncollected"] + s["buffer"]]


def execute(cfg: Config) -> Run:
    run = Run(cfg, random.Random(cfg.seed))
    for step in range(cfg.steps):
        run.step()
        if step in cfg.crash_steps:
            run.crash_and_resume()
    return run


configs = st.builds(
    Config,
    policy=st.sampled_from(["no_window", "window_gated", "windowed_fifo"]),
    batch_size=st.integers(1, 6),
    stale_steps=st.integers(0, 3),
    oversample=st.integers(0, 4),
    partial=st.booleans(),
    weights=st.sampled_from([{"a": 1.0}, {"a": 1.0, "b": 1.0}, {"a": 0.7, "b": 0.3}, {"a": 3.0, "b": 1.0, "c": 2.0}]),
    steps=st.integers(1, 10),
    crash_steps=st.frozensets(st.integers(0, 9), max_size=3),
    seed=st.integers(0, 2**31),
)


@settings(max_examples=300, deadline=None)
@given(cfg=configs)
def test_bounds_hold_and_no_group_is_lost_or_trained_twice(cfg: Config) -> None:
    run = execute(cfg)
    pipe = run.pipe
    # staleness: S, plus one version per batch of oversampled groups carried over
    assert run.max_staleness <= cfg.stale_steps + -(-cfg.oversample // cfg.batch_size)
    if cfg.oversample == 0:
        assert run.max_staleness <= cfg.stale_steps
    assert run.max_capacity_use <= int(cfg.batch_size * (1 + cfg.stale_steps)) + cfg.oversample
    for rec in run.recorders:
        if cfg.policy == "windowed_fifo":
            assert rec.max_collect_skew < cfg.batch_size
        if cfg.policy == "window_gated":
            assert rec.max_dispatch_span <= pipe.capacity
    # nothing trained twice, nothing lost: trained + pending = every seq ever dispatched
    assert len(set(run.trained_seqs)) == len(run.trained_seqs)
    assert len(set(run.trained_prompts)) == len(run.trained_prompts)
    assert sorted(run.trained_seqs + run.pending_seqs()) == list(range(pipe.next_seq))
    assert pipe.next_seq == dispatched(run.source)


@settings(max_examples=150, deadline=None)
@given(cfg=configs)
def test_resume_from_a_paused_partial_state_continues_exactly(cfg: Config) -> None:
    """Partial rollout pauses every call at the update, so the checkpoint holds everything:
    a resumed run must train exactly the batches the uninterrupted run trains."""
    cfg.partial = True
    cfg.crash_steps = frozenset()
    cfg.steps = max(cfg.steps, 2)
    crash_at = cfg.seed % (cfg.steps - 1)

    straight = execute(cfg)

    resumed = Run(cfg, random.Random(cfg.seed))
    for step in range(cfg.steps):
        resumed.step()
        if step == crash_at:
            rng_state = resumed.rng.getstate()
            resumed.crash_and_resume()
            resumed.rng.setstate(rng_state)
    assert resumed.batches == straight.batches
    assert resumed.pipe.state_dict() == straight.pipe.state_dict()


class NoGuardPipeline(Pipeline):
    """The pipeline with its staleness guard removed, to show the guard is what holds S."""

    def forced(self, entries, quota):
        return []


def straggler_run(policy: str, pipeline_cls: type = Pipeline, steps: int = 3) -> Run:
    """Group 0 decodes only when nothing else can; every other group finishes at once."""
    cfg = Config(policy, batch_size=2, stale_steps=1, oversample=0, partial=False,
                 weights={"a": 1.0}, steps=0, crash_steps=frozenset(), seed=0)
    run = Run(cfg, random.Random(0))
    run.pipe = pipeline_cls(Recorder(window_policy(policy)), 2, 1)
    run.pump()
    for _ in range(steps):
        while (batch := run.pipe.take_batch()) is None:
            others = [s for s in run.running if s != 0]
            group = run.running[others[0] if others else 0]
            group.advance(10_000)
            del run.running[group.seq]
            run.pipe.complete(group.seq, group.result())
            run.pump()
        run.record(batch, {"a": 2})
        run.pipe.on_weights_updated(run.pipe.version + 1)
        run.pump()
    return run


# windowed_fifo's collection gate already stalls the trainer at step 0 (seqs 2 and 3 are a
# batch ahead of the straggler); the other two reach the guard's deadline, step 1 = 0 + S.
@pytest.mark.parametrize("policy,step", [("no_window", 1), ("window_gated", 1), ("windowed_fifo", 0)])
def test_a_long_straggler_is_trained_by_its_deadline(policy: str, step: int) -> None:
    run = straggler_run(policy)
    assert next(i for i, b in enumerate(run.batches) if 0 in b) == step
    assert run.max_staleness <= 1


def test_without_the_guard_no_window_lets_a_straggler_miss_its_deadline() -> None:
    run = straggler_run("no_window", NoGuardPipeline, steps=4)
    assert all(0 not in b for b in run.batches)  # overtaken for 4 steps, still not trained
    assert 0 in run.running
