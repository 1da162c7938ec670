"""Scoring a group's samples under the reward's deadline, and what a failed call does.

Every reward call runs in a worker process of the run's ``DeadlinePool`` with its source's
``reward.timeout_s`` (the ``data_sources[i].reward`` node's, default the ``reward``
section's): a call that loops, or that is stuck in sympy on a factorial the model wrote,
is killed at its deadline and its worker replaced. A call *fails* when it times out,
raises, its worker dies, or its result is not a finite number or a dict with a finite
``score`` (NaN and inf are errors); the
source's ``reward.on_error`` then decides:

* ``zero``: the sample's reward is 0.0; the rest of the group is scored as usual.
* ``drop_group``: the group is not trained. ``score_group`` returns ``False`` and the
  rollout manager generates the prompt's group again from scratch, so both schedulers
  receive a complete scored group in its place and a batch always fills; a prompt whose
  group is dropped more than ``reward.drop_group_retries`` times in a row fails the run
  (``RewardFailed``), since its failures come from the prompt, not from one response.
* ``fail``: ``RewardFailed`` naming the data source, the reward and the sample.

In every mode a failed sample's ``reward_info`` says what happened: ``reward_failure``
(``"timeout"`` or ``"error"``) and ``reward_error`` ("timeout after 5 s (worker killed)",
or the exception as ``"ValueError: ..."``), and its reward is 0.0, so a dropped group's
trajectories are recorded with the reason too. ``RewardScorer.metrics()`` returns, and
resets, the counts since its last call: ``rollout/reward_timeouts``,
``rollout/reward_errors`` (failed samples) and ``rollout/reward_dropped_groups``; the loop
reads them once per step, so they count the calls that ended during that step.

A reward sees copies of ``prompt`` and ``sample`` in its context (they travel to the
worker): what it wants to report goes in its result dict, which joins ``reward_info``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from typing import Any, Mapping

from loongsage.data.sources import DataSource
from loongsage.data.types import Prompt, Sample
from loongsage.deadline.pool import CallFailed, DeadlinePool
from loongsage.errors import LoongSageError
from loongsage.schema import RewardOptions

log = logging.getLogger("loongsage.rewards")


class RewardFailed(LoongSageError):
    """A reward call failed under ``on_error: fail``, or a prompt's group kept being dropped."""


def apply_score(sample: Sample, result: Mapping[str, Any]) -> None:
    """Set ``sample.reward`` from a reward's result dict; its other fields join ``reward_info``
    next to what the agent reported (turns, tool calls, exit code)."""
    sample.reward = float(result["score"])
    sample.reward_info = {**sample.reward_info, **{k: v for k, v in result.items() if k != "score"}}


def _mark_failed(sample: Sample, failure: CallFailed) -> None:
    kind = "timeout" if failure.timed_out else "error"
    sample.reward = 0.0
    sample.reward_info = {**sample.reward_info, "reward_failure": kind, "reward_error": failure.reason}


def describe_sample(prompt: Prompt, i: int, sample: Sample) -> str:
    """``sample 3 of prompt arithmetic[17] (response '...')``, for errors."""
    text = sample.text if len(sample.text) <= 120 else sample.text[:117] + "..."
    return f"sample {i} of prompt {prompt.source}[{prompt.index}] (response {text!r})"


class RewardScorer:
    """Scores groups in ``pool``'s workers; applies each source's ``on_error``; counts failures."""

    def __init__(self, pool: DeadlinePool, drop_group_retries: int = 2) -> None:
        self.pool = pool
        self.drop_group_retries = drop_group_retries
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()  # counted on the rollout loop, read by the controller

    async def _one(self, source: DataSource, prompt: Prompt, sample: Sample) -> CallFailed | None:
        timeout = _options(source).timeout_s
        try:
            result = await self.pool.call(timeout, source.reward_call, sample.text, prompt.ground_truth,
                                          prompt=prompt, sample=sample)
        except CallFailed as failure:
            return failure
        apply_score(sample, result)
        return None

    async def score_group(self, source: DataSource, prompt: Prompt, samples: list[Sample]) -> bool:
        """Score every sample of a group; ``False`` when ``on_error: drop_group`` dropped it."""
        outcomes = await asyncio.gather(*(self._one(source, prompt, s) for s in samples))
        failed = [(i, f) for i, f in enumerate(outcomes) if f is not None]
        if not failed:
            return True
        for i, failure in failed:
            _mark_failed(samples[i], failure)
        self._count(reward_timeouts=sum(f.timed_out for _, f in failed),
                    reward_errors=sum(not f.timed_out for _, f in failed))
        ref, on_error = source.spec.reward, _options(source).on_error
        i, first = failed[0]
        sample = describe_sample(prompt, i, samples[i])
        what = f"{ref.key} (source {source.name!r}): reward '{ref.name}' failed on {sample}"
        if on_error == "fail":
            detail = f"\n{first.traceback_text}" if first.traceback_text else ""
            raise RewardFailed(f"{what}: {first.reason} (on_error=fail; {len(failed)} of {len(samples)} "
                               f"samples of the group failed){detail}")
        log.warning("%s: %s; %d of %d samples of the group failed (on_error=%s)",
                    what, first.reason, len(failed), len(samples), on_error)
        return on_error != "drop_group"

    def dropped(self, source: DataSource, prompt: Prompt, times: int) -> None:
        """Count a dropped group; ``RewardFailed`` once a prompt is dropped too often in a row."""
        self._count(reward_dropped_groups=1)
        if times > self.drop_group_retries:
            ref = source.spec.reward
            raise RewardFailed(
                f"{ref.key} (source {source.name!r}): reward '{ref.name}' failed on the group of prompt "
                f"{prompt.source}[{prompt.index}] {times} times in a row (on_error=drop_group regenerates "
                f"it at most reward.drop_group_retries={self.drop_group_retries} times); the prompt or "
                "the reward is at fault, see the warnings above")

    def _count(self, **counts: int) -> None:
        with self._lock:
            self._counts.update(counts)

    def metrics(self) -> dict[str, float]:
        """Failures since the last call (and reset): timeouts, errors, dropped groups."""
        with self._lock:
            counts, self._counts = self._counts, Counter()
        names = ("reward_timeouts", "reward_errors", "reward_dropped_groups")
        return {f"rollout/{name}": float(counts[name]) for name in names}


def _options(source: DataSource) -> RewardOptions:
    return source.spec.reward.options or RewardOptions()


def reward_modules(sources: Mapping[str, DataSource]) -> list[str]:
    """The modules that hold the sources' rewards, for the worker pool to preload."""
    modules = set()
    for source in sources.values():
        target = source.spec.reward.entry.target
        module = target.partition(":")[0] if isinstance(target, str) else getattr(target, "__module__", None)
        if module and module != "__main__":
            modules.add(module)
    return sorted(modules)
