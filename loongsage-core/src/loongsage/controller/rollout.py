"""The rollout manager: turns prompts into scored prompt groups using the engines.

For each prompt it runs the data source's agent ``n`` times against the least-loaded
engine, scores every sample with the source's reward, and returns a ``Group``. It owns
one background event loop, so the synchronous scheduler can call ``generate_groups`` and
the asynchronous runtime can submit ``generate_group`` coroutines to the same loop.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from loongsage.data.types import Group, Prompt, Sample


@dataclass
class SourceRuntime:
    """What the rollout needs of one data source, built from its config."""

    name: str
    agent: Any  # has `async run_group(prompt, n, client, sampling_params) -> list[Sample]`
    reward: Callable[..., Any]
    reward_params: Any
    sampling: dict[str, Any] = field(default_factory=dict)


class EventLoopThread:
    """A private asyncio loop on a daemon thread, for running coroutines from sync code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="loongsage-rollout", daemon=True)
        self._thread.start()

    def run(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def submit(self, coro) -> "asyncio.Future":
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


def score(sample: Sample, reward: Callable[..., Any], params: Any, prompt: Prompt) -> None:
    """Fill ``sample.reward`` from a reward returning a float or a dict; a dict's other fields
    join ``reward_info`` next to what the agent reported (turns, tool calls, exit code)."""
    result = reward(sample.text, prompt.ground_truth, params, prompt=prompt, sample=sample)
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"reward for source '{prompt.source}' returned a dict without 'score': {result}")
        sample.reward = float(result["score"])
        sample.reward_info = {**sample.reward_info, **{k: v for k, v in result.items() if k != "score"}}
    else:
        sample.reward = float(result)


class RolloutManager:
    """Generate and score prompt groups across a pool of engine clients."""

    def __init__(
        self,
        sources: dict[str, SourceRuntime],
        clients: Sequence[Any],
        n_samples: int,
        sampling_params: dict[str, Any],
    ) -> None:
        if not clients:
            raise ValueError("RolloutManager needs at least one engine client")
        self.sources = sources
        self.clients = list(clients)
        self.in_flight = [0] * len(self.clients)
        self.n_samples = n_samples
        self.sampling_params = dict(sampling_params)
        self.loop = EventLoopThread()

    def _pick_engine(self) -> int:
        return min(range(len(self.clients)), key=self.in_flight.__getitem__)

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
        ``resume_from`` and the agent continues those samples under the new weights.
        """
        source = self.sources[prompt.source]
        params = {**self.sampling_params, **source.sampling, **(sampling or {})}
        engine = self._pick_engine()
        client = self.clients[engine]
        self.in_flight[engine] += 1
        try:
            if resume_from is None:
                samples = await source.agent.run_group(prompt, n or self.n_samples, client, params)
            else:
                samples = list(
                    await asyncio.gather(*(self._resume(source, s, client, params) for s in resume_from.samples))
                )
        finally:
            self.in_flight[engine] -= 1
        if not any(s.finish_reason == "abort" for s in samples):
            await asyncio.gather(
                *(asyncio.to_thread(score, s, source.reward, source.reward_params, prompt) for s in samples)
            )
            record = getattr(source.agent, "record_rewards", None)
            if record is not None:  # router-based agents keep rewards with their trajectories
                record(samples)
        dispatched = version if resume_from is None else resume_from.dispatch_version
        return Group(group_id=group_id, prompt=prompt, samples=samples, dispatch_version=dispatched)

    @staticmethod
    async def _resume(source: SourceRuntime, sample: Sample, client: Any, params: dict[str, Any]) -> Sample:
        if sample.finish_reason != "abort":
            return sample
        return await source.agent.continue_sample(sample, client, params)

    def abort_all(self) -> None:
        """Abort every in-flight generation on every engine (partial rollout at a step end)."""
        for client in self.clients:
            client.abort(abort_all=True)

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

    def close(self) -> None:
        self.loop.close()
