"""AsyncScheduler, the event-loop driver, with a simulated rollout.

The rollout is simulated (``runtime_sim.AsyncSimRollout``: long-tailed token counts
decoded a few tokens per sub-millisecond tick, abortable like an engine) because these
tests are about the driver: overlap with training, pause/abort/continue at weight
updates, thread-pool rollouts, errors, stalls and crash/resume. Assertions are on data
(which groups, which versions), never on speed.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from loongsage.data.types import Group, Prompt, Sample
from loongsage.runtime.async_scheduler import AsyncScheduler, SchedulerStalled
from runtime_sim import AsyncSimRollout, dispatched, make_source, start_group, window_policy

WEIGHTS = {"math": 2.0, "code": 1.0, "chat": 1.0}


def make(policy: str = "no_window", *, batch_size: int = 4, stale_steps: int = 1, partial: bool = False,
         oversample: int = 0, rollout=None, source=None):
    source = source or make_source(batch_size, WEIGHTS, seed=1)
    rollout = rollout or AsyncSimRollout(n_samples=2, tokens_per_tick=4)
    sched = AsyncScheduler(
        window_policy(policy), source, rollout, batch_size, stale_steps,
        quotas=source.quotas, oversample=oversample, partial=partial,
        abort_inflight=getattr(rollout, "abort_all", None) if partial else None,
    )
    return sched, source, rollout


def train(sched: AsyncScheduler, steps: int, first_step: int = 0, train_s: float = 0.01) -> list[list[Group]]:
    batches = []
    for step in range(first_step, first_step + steps):
        batches.append(sched.next_batch(step))
        time.sleep(train_s)  # the trainer's step; rollouts keep running meanwhile
        sched.pause()
        sched.on_weights_updated(step + 1)
    return batches


@pytest.mark.parametrize("policy", ["no_window", "window_gated", "windowed_fifo"])
@pytest.mark.parametrize("partial", [False, True])
def test_runs_with_exact_shares_bounded_staleness_and_no_duplicates(policy: str, partial: bool) -> None:
    sched, source, rollout = make(policy, partial=partial)
    try:
        batches = train(sched, 8)
        metrics = sched.metrics()
    finally:
        sched.close()
    keys = [(g.prompt.source, g.prompt.index) for b in batches for g in b]
    assert len(keys) == len(set(keys)) == 32
    for step, batch in enumerate(batches):
        shares = {}
        for g in batch:
            shares[g.prompt.source] = shares.get(g.prompt.source, 0) + 1
            assert all(step - v <= 1 for s in g.samples for v in s.weight_versions)
            assert all(s.finish_reason == "stop" for s in g.samples)
        assert shares == {"math": 2, "code": 1, "chat": 1}
    resumed = [(seq, v) for seq, v, again in rollout.calls if again]
    spans = [len(set(s.weight_versions)) for b in batches for g in b for s in g.samples]
    if partial:
        assert resumed, "no generation was in flight at any of 8 updates"
        # a continued generation is called with the version current at its resume
        first_call = {seq: v for seq, v, again in rollout.calls if not again}
        assert all(v > first_call[seq] for seq, v in resumed)
    else:
        assert not resumed and max(spans) == 1
    assert 0.0 <= metrics["async/staleness_mean"] <= metrics["async/staleness_max"] <= 1.0
    assert metrics["perf/trainer_wait_s"] >= 0.0 and metrics["perf/rollout_wait_s"] >= 0.0


def test_staleness_zero_is_synchronous_and_the_rollout_idles_while_training() -> None:
    sched, _, rollout = make(stale_steps=0, batch_size=2)
    try:
        for step in range(3):
            batch = sched.next_batch(step)
            assert {v for g in batch for s in g.samples for v in s.weight_versions} == {step}
            assert len(rollout.calls) == 2 * (step + 1)  # nothing dispatched past the batch
            time.sleep(0.05)
            sched.on_weights_updated(step + 1)
        # capacity B: between a batch and the next update nothing runs
        assert sched.metrics()["perf/rollout_wait_s"] >= 0.05
    finally:
        sched.close()


def test_a_plain_function_rollout_runs_in_a_thread_pool() -> None:
    threads = set()

    def rollout(prompt: Prompt, group_id: int, version: int) -> Group:
        threads.add(threading.get_ident())
        time.sleep(0.002 * (group_id % 3))
        sim = start_group(prompt, group_id, version, 2)
        sim.advance(10_000)
        return sim.result()

    sched, _, _ = make("windowed_fifo", rollout=rollout)
    try:
        batches = train(sched, 3)
    finally:
        sched.close()
    assert sorted(g.group_id for b in batches for g in b) == sorted({g.group_id for b in batches for g in b})
    assert threading.get_ident() not in threads and len(threads) >= 1


def test_a_failing_rollout_is_reported_to_the_trainer() -> None:
    async def rollout(prompt: Prompt, group_id: int, version: int) -> Group:
        if group_id == 2:
            raise ValueError("engine returned HTTP 500 for group 2")
        sim = start_group(prompt, group_id, version, 1)
        sim.advance(10_000)
        return sim.result()

    sched, _, _ = make(rollout=rollout)
    try:
        with pytest.raises(RuntimeError, match="HTTP 500 for group 2"):
            train(sched, 3)
    finally:
        sched.close()


def test_a_trainer_that_never_updates_weights_gets_a_clear_stall_error() -> None:
    sched, _, _ = make(stale_steps=0, batch_size=2)
    try:
        sched.next_batch(0)
        with pytest.raises(SchedulerStalled, match="on_weights_updated"):
            sched.next_batch(1)
    finally:
        sched.close()


def test_bad_configuration_is_rejected_naming_the_field() -> None:
    source = make_source(4, WEIGHTS)
    with pytest.raises(ValueError, match="rollout.partial=true"):
        AsyncScheduler(window_policy("no_window"), source, AsyncSimRollout(), 4, 1, partial=True)
    with pytest.raises(ValueError, match="async.stale_steps: expected an integer >= 0"):
        AsyncScheduler(window_policy("no_window"), source, AsyncSimRollout(), 4, 0.5)
    sched = AsyncScheduler(window_policy("no_window"), source, AsyncSimRollout(), 4, 1,
                           quotas=lambda step: {"math": 2, "code": 1})
    try:
        with pytest.raises(ValueError, match="sum to 3, expected the batch size 4"):
            sched.next_batch(0)
    finally:
        sched.close()


@pytest.mark.parametrize("partial", [False, True])
def test_resume_after_a_crash_loses_and_repeats_nothing(partial: bool) -> None:
    sched, source, _ = make("windowed_fifo", partial=partial, oversample=2)
    try:
        before = train(sched, 3)
        state = sched.state_dict()  # taken while later groups are still generating
    finally:
        sched.close()
    fresh_source = make_source(4, WEIGHTS, seed=1)
    sched2, _, _ = make("windowed_fifo", partial=partial, oversample=2, source=fresh_source)
    try:
        sched2.load_state_dict(state)
        assert dispatched(fresh_source) == state["pipeline"]["next_seq"]
        after = train(sched2, 4, first_step=3)
        pending = sched2.state_dict()["pipeline"]
    finally:
        sched2.close()
    trained = [g.group_id for b in before + after for g in b]
    pending_seqs = [e["seq"] for e in pending["uncollected"] + pending["buffer"]]
    assert len(trained) == len(set(trained)) == 28
    assert sorted(trained + pending_seqs) == list(range(pending["next_seq"]))
    prompts = [(g.prompt.source, g.prompt.index) for b in before + after for g in b]
    assert len(prompts) == len(set(prompts))


def test_built_from_a_composed_recipe() -> None:
    from loongsage.config.compose import load_config
    from loongsage.runtime.scheduler import async_scheduler_from_config
    from loongsage.runtime.window import WindowedFifo

    run = load_config("tiny/grpo", [
        "async.enable=true", "placement.mode=disaggregated", "async.stale_steps=2",
        "+async.window_policy.skew=2", "async.window_policy.name=windowed_fifo",
        "rollout.partial=true", "rollout.oversample_groups=3",
    ])
    source = make_source(run.cfg.rollout.prompts_per_step, WEIGHTS)
    rollout = AsyncSimRollout()
    sched = async_scheduler_from_config(run.cfg, run.window_policy, prompt_source=source, rollout_group=rollout,
                                        abort_inflight=rollout.abort_all)
    try:
        pipe = sched.pipeline
        assert isinstance(pipe.policy, WindowedFifo) and pipe.policy.params.skew == 2
        assert pipe.capacity == 8 * 3 + 3 and pipe.staleness_bound == 3 and pipe.partial
        batches = train(sched, 2)
    finally:
        sched.close()
    assert [len(b) for b in batches] == [8, 8]


def test_colocated_partial_window_is_synchronous_plus_oversampling() -> None:
    """Without async.enable the default async.stale_steps=1 must not widen the window."""
    from loongsage.config.compose import load_config
    from loongsage.runtime.scheduler import async_scheduler_from_config

    run = load_config("tiny/grpo", ["rollout.partial=true", "rollout.oversample_groups=4"])
    assert run.cfg["async"].stale_steps == 1
    source = make_source(run.cfg.rollout.prompts_per_step, WEIGHTS)
    rollout = AsyncSimRollout()
    sched = async_scheduler_from_config(run.cfg, run.window_policy, prompt_source=source, rollout_group=rollout,
                                        abort_inflight=rollout.abort_all)
    try:
        assert sched.pipeline.capacity == 8 + 4 and sched.pipeline.staleness_bound == 1
        assert [len(b) for b in train(sched, 2)] == [8, 8]
    finally:
        sched.close()


class SimRolloutManager:
    """What ``build_scheduler`` reads of the rollout manager, over the simulated rollout."""

    def __init__(self, rollout: AsyncSimRollout) -> None:
        self.generate_group = rollout
        self.abort_for_update = rollout.abort_all

    def resume_after_update(self) -> None:
        """The simulated engines hold nothing back."""

    def continues_in_place(self, prompt) -> bool:
        return False

    def generate_groups(self, *args, **kwargs):
        raise AssertionError("oversampling must not go through the all-or-nothing synchronous path")


def test_oversampling_in_synchronous_mode_trains_b_groups_and_carries_the_rest() -> None:
    """`rollout.oversample_groups=O` without async or partial rollout: the run's scheduler
    dispatches B + O groups, trains the first B to finish and carries the rest into the next
    step (at most one version stale); none is lost or trained twice, also across a checkpoint.
    Before, the synchronous scheduler accepted the key and dispatched B groups per step."""
    from loongsage.config.compose import load_config
    from loongsage.controller.build import build_scheduler
    from loongsage.data.mixer import DataMixer
    from loongsage.runtime.event_loop import EventLoopThread

    from runtime_sim import ListSource

    run = load_config("tiny/grpo", ["rollout.oversample_groups=4", "rollout.prompts_per_step=8"])
    loop = EventLoopThread()
    rollout = AsyncSimRollout(n_samples=2, tokens_per_tick=4)

    def scheduler():
        mixer = DataMixer([ListSource(n, w) for n, w in WEIGHTS.items()], seed=3)
        return build_scheduler(run, mixer, SimRolloutManager(rollout), loop)

    sched = scheduler()
    try:
        pipe = sched.pipeline
        assert (pipe.capacity, pipe.stale_steps, pipe.staleness_bound, pipe.partial) == (12, 0, 1, False)
        before = train(sched, 3)
        state = sched.state_dict()
    finally:
        sched.close()
    resumed = scheduler()
    try:
        resumed.load_state_dict(state)
        after = train(resumed, 3, first_step=3)
    finally:
        resumed.close()
        loop.close()
    batches = before + after
    assert [len(b) for b in batches] == [8] * 6
    trained = [g.group_id for b in batches for g in b]
    assert len(trained) == len(set(trained))  # none trained twice, also across the resume
    carried = [g for step, b in enumerate(batches) for g in b if g.dispatch_version < step]
    assert carried and all(step - g.dispatch_version <= 1 for step, b in enumerate(batches) for g in b)
    dispatched_seqs = {seq for seq, _, _ in rollout.calls}
    assert set(trained) < dispatched_seqs  # the surplus is still in flight or buffered, not lost


class InPlaceRollout:
    """A router-based agent's group as the scheduler sees it (simulated, like the rest of this
    module): the call never returns aborted; at a weight update its turn waits while the pool
    holds and goes on under the new weights, one token per version it ran under."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, bool]] = []  # (seq, version, resumed)
        self.release: dict[int, asyncio.Event] = {}
        self.engine_version = 0
        self.held = False
        self.aborts = self.resumes = 0

    async def __call__(self, prompt: Prompt, seq: int, version: int, resume_from=None) -> Group:
        self.calls.append((seq, version, resume_from is not None))
        versions = [self.engine_version]
        gate = self.release.setdefault(seq, asyncio.Event())
        await gate.wait()
        while self.held:
            await asyncio.sleep(0.001)
        if self.engine_version != versions[-1]:
            versions.append(self.engine_version)
        sample = Sample(prompt_ids=[1], response_ids=[7] * len(versions), response_logprobs=[-1.0] * len(versions),
                        weight_versions=versions, loss_mask=[1] * len(versions))
        return Group(group_id=seq, prompt=prompt, samples=[sample], dispatch_version=version)

    async def abort(self) -> None:
        self.held = True
        self.aborts += 1

    def resume(self) -> None:
        self.held = False
        self.resumes += 1


def test_a_group_that_continues_in_place_stays_in_flight_across_an_update_counted_once() -> None:
    """Partial rollout with a router-based agent: ``pause()`` does not wait for its group (the
    agent program is still running), the group keeps its slot and its dispatch version across
    the update, is never re-dispatched, and the staleness guard trains it by its deadline."""
    rollout = InPlaceRollout()
    source = make_source(1, {"math": 1.0}, seed=1)
    sched = AsyncScheduler(window_policy("no_window"), source, rollout, 1, 0, quotas=source.quotas,
                           oversample=1, partial=True, abort_inflight=rollout.abort,
                           resume_inflight=rollout.resume, continues_in_place=lambda prompt: True)
    loop = sched._loop
    try:
        pipe = sched.pipeline
        assert (pipe.capacity, pipe.staleness_bound) == (2, 1)
        loop.call_soon_threadsafe(lambda: rollout.release.setdefault(0, asyncio.Event()).set())
        [first] = sched.next_batch(0)
        assert first.group_id == 0 and [s for s, _, _ in rollout.calls] == [0, 1]
        paused = threading.Thread(target=sched.pause)
        paused.start()
        paused.join(timeout=10)
        assert not paused.is_alive(), "pause() waited for a group that continues in place"
        assert rollout.aborts == 1 and pipe.view().in_flight == 1  # seq 1, once
        rollout.engine_version = 1
        sched.on_weights_updated(1)
        assert rollout.resumes == 1 and not rollout.held
        assert [s for s, _, _ in rollout.calls] == [0, 1, 2]  # seq 1 not re-dispatched
        assert pipe.view().in_flight == 2 and pipe.view().free == 0
        loop.call_soon_threadsafe(lambda: [rollout.release.setdefault(s, asyncio.Event()).set() for s in (1, 2)])
        [carried] = sched.next_batch(1)
        metrics = sched.metrics()
    finally:
        sched.close()
    assert carried.group_id == 1 and carried.dispatch_version == 0
    assert carried.samples[0].weight_versions == [0, 1]
    assert metrics["rollout/partial_ratio"] == 1.0 and metrics["async/staleness_max"] == 1.0
    assert not any(resumed for _, _, resumed in rollout.calls)
