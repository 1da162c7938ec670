"""The rollout manager: turns prompts into scored prompt groups using the engines.

For each prompt it runs the data source's agent ``n`` times against the run's engine pool
(the one load balancer, shared with the AgentFlow routers), scores every sample with the
source's reward in the reward worker processes, under the reward's deadline
(``loongsage.data.scoring``), hands the scored samples to ``on_scored`` (the run persists
router trajectories' rewards there) and returns a ``Group``. A group the reward's
``on_error: drop_group`` drops is generated again from its prompt before
``generate_group`` returns, so every scheduler receives complete scored groups and never
waits for a slot a dropped group left empty. A sample its agent marked failed
(``reward_info["failed"]``: the agent process timed out, its engine turn failed) gets reward 0
(``rollout.failed_trajectory=zero_reward``) or has its group generated again
(``drop_group``); both are counted (``rollout/failed_trajectories``). Its coroutines run on the run's one rollout
event loop, whichever scheduler drives them: the synchronous scheduler through
``generate_groups``, the asynchronous one by awaiting ``generate_group``.

Every group is generated under its own seed, ``sampling_params["sampling_seed"]`` as its agent
receives it: a function of ``trainer.seed``, the weight version it was dispatched at (the step, in
a synchronous run), the prompt's source and index and how many times the group was generated
again (``engines.sampling_seed``). The agent derives each sample's seed from it
(``sample_seed``), so what a sample draws depends on neither its batch nor its engine.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping, Sequence

from loongsage.data.scoring import RewardScorer
from loongsage.data.sources import DataSource
from loongsage.data.types import Group, Prompt, Sample
from loongsage.engines.pool import EnginePool
from loongsage.engines.sampling_seed import SEED_KEY, derive_seed
from loongsage.errors import LoongSageError
from loongsage.runtime.event_loop import EventLoopThread

OnScored = Callable[[str, list[Sample]], None]


class RolloutManager:
    """Generate and score prompt groups across the run's engine pool."""

    def __init__(
        self,
        sources: Mapping[str, DataSource],
        pool: EnginePool,
        loop: EventLoopThread,
        n_samples: int,
        sampling_params: dict[str, Any],
        scorer: RewardScorer,
        on_scored: OnScored | None = None,
        failed_trajectory: str = "zero_reward",
        seed: int = 0,
    ) -> None:
        self.sources = dict(sources)
        self.pool = pool
        self.loop = loop
        self.n_samples = n_samples
        self.sampling_params = dict(sampling_params)
        self.scorer = scorer
        self.on_scored = on_scored
        self.drop_failed = failed_trajectory == "drop_group"
        self._failed_samples = self._failed_groups = 0
        self.seed = seed

    async def _score(self, source: DataSource, prompt: Prompt, samples: list[Sample]) -> bool:
        """Score the group (``False``: dropped by ``on_error: drop_group``) and report it."""
        kept = await self.scorer.score_group(source, prompt, samples)
        for sample in samples:
            if sample.reward_info.get("failed"):  # rollout.failed_trajectory=zero_reward
                sample.reward = 0.0
        if self.on_scored is not None:
            self.on_scored(source.name, samples)
        return kept

    def reward_metrics(self) -> dict[str, float]:
        """Reward timeouts, errors and dropped groups since the last call (``RewardScorer``)."""
        return self.scorer.metrics()

    def failure_metrics(self) -> dict[str, float]:
        """Failed trajectories kept (reward 0) and groups generated again for one, since the last call."""
        metrics = {"rollout/failed_trajectories": float(self._failed_samples),
                   "rollout/failed_trajectory_groups_dropped": float(self._failed_groups)}
        self._failed_samples = self._failed_groups = 0
        return metrics

    async def generate_group(
        self,
        prompt: Prompt,
        group_id: int,
        version: int,
        resume_from: Group | None = None,
        *,
        n: int | None = None,
        sampling: dict[str, Any] | None = None,
    ) -> Group:
        """Generate (or, with ``resume_from``, continue) one group; score it once complete.

        A group whose generation was aborted at a weight update comes back unscored with
        its aborted samples' partial tokens; the scheduler passes it back as
        ``resume_from`` and the agent continues those samples under the new weights. A
        group the reward drops (``on_error: drop_group``) is generated again from scratch.
        """
        source = self.sources[prompt.source]
        params = {**self.sampling_params, **source.sampling, **(sampling or {})}
        count = n or self.n_samples if resume_from is None else len(resume_from.samples)
        generated = 0

        def seeded() -> dict[str, Any]:  # each generation of the group draws anew
            nonlocal generated
            generated += 1
            return {**params, SEED_KEY: derive_seed(self.seed, version, prompt.source, prompt.index, generated)}

        if resume_from is None:
            samples = await source.agent.run_group(prompt, count, self.pool, seeded())
        else:
            samples = list(await asyncio.gather(*(self._resume(source, s, params) for s in resume_from.samples)))
        drops = failures = 0
        while self.drop_failed and resume_from is None and _failed(samples):
            failures += 1
            self._failed_groups += 1
            if failures > self.scorer.drop_group_retries:
                raise TrajectoryFailed(
                    f"rollout.failed_trajectory=drop_group: the group of prompt {prompt.source}[{prompt.index}] "
                    f"had a failed trajectory {failures} times in a row (regenerated at most "
                    f"reward.drop_group_retries={self.scorer.drop_group_retries} times); the last: {_failed(samples)[0]}")
            samples = await source.agent.run_group(prompt, count, self.pool, seeded())
        self._failed_samples += len(_failed(samples))
        while not _aborted(samples) and not await self._score(source, prompt, samples):
            drops += 1
            self.scorer.dropped(source, prompt, drops)
            samples = await source.agent.run_group(prompt, count, self.pool, seeded())
        dispatched = version if resume_from is None else resume_from.dispatch_version
        return Group(group_id=group_id, prompt=prompt, samples=samples, dispatch_version=dispatched)

    async def _resume(self, source: DataSource, sample: Sample, params: dict[str, Any]) -> Sample:
        if not sample.awaits_continuation:
            return sample
        return await source.agent.continue_sample(sample, self.pool, params)

    def engine_metrics(self) -> dict[str, float]:
        """``rollout/engine_requests/<i>``: requests each engine served since the last call;
        ``rollout/prefill_tokens`` (prompt tokens the engines computed) and
        ``rollout/prefix_cache_hit_ratio`` (cached / submitted prompt tokens), from every
        finished generation's ``meta_info.cached_tokens`` (the embedded engine's prefix cache,
        SGLang's radix cache) since the last call."""
        metrics = {f"rollout/engine_requests/{i}": float(n) for i, n in enumerate(self.pool.take_served())}
        prompt, cached = self.pool.take_prompt_usage()
        if prompt:
            metrics["rollout/prefill_tokens"] = float(prompt - cached)
            metrics["rollout/prefix_cache_hit_ratio"] = cached / prompt
        return metrics

    async def abort_for_update(self) -> None:
        """Partial rollout at a weight update: the pool holds new requests and aborts every
        running one (``EnginePool.abort_for_update``); white-box groups come back with their
        aborted samples, router turns wait in the pool to be continued."""
        await self.pool.abort_for_update()

    def resume_after_update(self) -> None:
        """The new weights are live: the pool sends the requests it held."""
        self.pool.resume_after_update()

    def continues_in_place(self, prompt: Prompt) -> bool:
        """Whether ``prompt``'s agent continues its aborted turns itself (router-based agents:
        the router continues them), so its group stays in flight across a weight update."""
        return bool(getattr(self.sources[prompt.source].agent, "continues_turns_in_place", False))

    def generate_groups(
        self, prompts: Sequence[Prompt], first_group_id: int, version: int, **options: Any
    ) -> list[Group]:
        """Generate and score one group per prompt concurrently (``options``: n, sampling)."""

        async def all_groups() -> list[Group]:
            return list(
                await asyncio.gather(
                    *(self.generate_group(p, first_group_id + i, version, **options) for i, p in enumerate(prompts))
                )
            )

        return self.loop.run(all_groups())


class TrajectoryFailed(LoongSageError):
    """A prompt's group kept a failed trajectory past its regenerations (drop_group)."""


def _failed(samples: list[Sample]) -> list[str]:
    """Why each failed sample failed (agents mark them in ``reward_info["failed"]``)."""
    return [s.reward_info["failed"] for s in samples if s.reward_info.get("failed")]


def _aborted(samples: list[Sample]) -> bool:
    return any(s.awaits_continuation for s in samples)
