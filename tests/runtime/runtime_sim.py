"""Simulated prompts and rollouts for the scheduler tests.

The rollouts here are simulated on purpose: the scheduler's job is the gate logic
(which group may start, which may be trained, what carries over), and a real engine would
make completion orders slow and impossible to enumerate. Each group's response lengths
come from a long-tailed distribution seeded by its prompt, so a simulated run is a
deterministic function of its event order, which hypothesis draws.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Optional

from loongsage.data.types import Group, Prompt, Sample


def apportion(batch_size: int, weights: dict[str, float]) -> dict[str, int]:
    """Largest-remainder split of one batch over sources (ties broken by name)."""
    total = sum(weights.values())
    exact = {s: batch_size * w / total for s, w in weights.items()}
    counts = {s: int(x) for s, x in exact.items()}
    rest = sorted(exact, key=lambda s: (-(exact[s] - counts[s]), s))
    for s in rest[: batch_size - sum(counts.values())]:
        counts[s] += 1
    return counts


class ChunkedSource:
    """Prompt stream with exact per-batch shares: each chunk of B prompts holds quota[s] of s.

    A stand-in for the DataMixer (same contract: next_prompt, state_dict, load_state_dict).
    """

    def __init__(self, batch_size: int, weights: dict[str, float], seed: int = 0) -> None:
        self.quota = apportion(batch_size, weights)
        self.seed = seed
        self.drawn = 0
        self._per_source = {s: 0 for s in weights}

    def quotas(self, step: int) -> dict[str, int]:
        return dict(self.quota)

    def _chunk(self, k: int) -> list[str]:
        names = [s for s, n in sorted(self.quota.items()) for _ in range(n)]
        random.Random(self.seed * 100003 + k).shuffle(names)
        return names

    def next_prompt(self) -> Prompt:
        b = sum(self.quota.values())
        source = self._chunk(self.drawn // b)[self.drawn % b]
        index = self._per_source[source]
        self._per_source[source] += 1
        self.drawn += 1
        return Prompt(source=source, index=index, messages=[{"role": "user", "content": f"{source}-{index}"}])

    def state_dict(self) -> dict:
        return {"drawn": self.drawn, "per_source": dict(self._per_source)}

    def load_state_dict(self, state: dict) -> None:
        self.drawn = state["drawn"]
        self._per_source = dict(state["per_source"])


def target_lengths(prompt: Prompt, n_samples: int) -> list[int]:
    """Long-tailed response lengths (Pareto-like), a deterministic function of the prompt."""
    rng = random.Random(f"{prompt.source}/{prompt.index}")
    return [min(400, int(4 * rng.paretovariate(1.2))) for _ in range(n_samples)]


@dataclass
class SimGroup:
    """One simulated generation in progress."""

    seq: int
    prompt: Prompt
    version: int
    samples: list[Sample] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)

    def done(self) -> bool:
        return all(len(s.response_ids) >= t for s, t in zip(self.samples, self.targets))

    def advance(self, tokens: int) -> None:
        """Decode up to ``tokens`` more tokens of every unfinished sample."""
        for s, t in zip(self.samples, self.targets):
            for _ in range(min(tokens, t - len(s.response_ids))):
                s.response_ids.append(len(s.response_ids) % 50)
                s.response_logprobs.append(-1.0)
                s.weight_versions.append(self.version)
                s.loss_mask.append(1)
            s.finish_reason = "stop" if len(s.response_ids) >= t else "abort"

    def result(self) -> Group:
        samples = [
            Sample(
                prompt_ids=list(s.prompt_ids),
                response_ids=list(s.response_ids),
                response_logprobs=list(s.response_logprobs),
                weight_versions=list(s.weight_versions),
                loss_mask=list(s.loss_mask),
                finish_reason=s.finish_reason,
            )
            for s in self.samples
        ]
        return Group(group_id=self.seq, prompt=self.prompt, samples=samples, dispatch_version=self.version)


def start_group(prompt: Prompt, seq: int, version: int, n_samples: int, resume_from: Optional[Group] = None) -> SimGroup:
    """Begin a group, or continue the aborted samples of ``resume_from`` under ``version``."""
    sim = SimGroup(seq, prompt, version, targets=target_lengths(prompt, n_samples))
    if resume_from is None:
        sim.samples = [Sample([1, 2, 3], [], [], [], [], finish_reason="abort") for _ in range(n_samples)]
    else:
        sim.samples = [
            Sample(list(s.prompt_ids), list(s.response_ids), list(s.response_logprobs),
                   list(s.weight_versions), list(s.loss_mask), s.finish_reason)
            for s in resume_from.samples
        ]
    return sim


class AsyncSimRollout:
    """An async ``rollout_group`` decoding simulated tokens, abortable like an engine."""

    def __init__(self, n_samples: int = 2, tokens_per_tick: int = 8, tick_s: float = 0.0005) -> None:
        self.n_samples = n_samples
        self.tokens_per_tick = tokens_per_tick
        self.tick_s = tick_s
        self.calls: list[tuple[int, int, bool]] = []  # (seq, version, resumed)
        self._abort_gen = 0

    async def __call__(self, prompt: Prompt, group_id: int, version: int, resume_from: Optional[Group] = None) -> Group:
        self.calls.append((group_id, version, resume_from is not None))
        sim = start_group(prompt, group_id, version, self.n_samples, resume_from)
        gen = self._abort_gen
        while not sim.done() and self._abort_gen == gen:
            sim.advance(self.tokens_per_tick)
            await asyncio.sleep(self.tick_s)
        return sim.result()

    async def abort_all(self) -> None:
        """What the engine client's pause_generation(mode='abort') does: running calls return."""
        self._abort_gen += 1
