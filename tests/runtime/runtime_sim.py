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

from loongsage.data.mixer import DataMixer
from loongsage.data.types import Group, Prompt, Sample
from loongsage.runtime.prompt_source import BatchedPromptSource


@dataclass
class ListSource:
    """An in-memory data source for the real DataMixer: prompt ``i`` of ``name`` is ``name-i``."""

    name: str
    weight: float
    n: int = 1000

    def size(self) -> int:
        return self.n

    def get(self, index: int) -> Prompt:
        return Prompt(source=self.name, index=index, messages=[{"role": "user", "content": f"{self.name}-{index}"}])


def make_source(batch_size: int, weights: dict[str, float], seed: int = 0) -> BatchedPromptSource:
    """The real DataMixer (exact per-batch shares, varying with its carried rounding) behind the
    scheduler's adapter; each source has 1000 prompts, so ``index`` is unique within an epoch."""
    mixer = DataMixer([ListSource(name, w) for name, w in weights.items()], seed=seed)
    return BatchedPromptSource(mixer, batch_size)


def dispatched(source: BatchedPromptSource) -> int:
    """Prompts handed to the scheduler so far (drawn by the mixer minus those still queued)."""
    state = source.state_dict()
    return state["mixer"]["drawn"] - len(state["queue"])


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


def window_policy(node, registries=None):
    """The window policy a config node names, resolved as config validation does and built."""
    from loongsage.plugins import get_registries
    from loongsage.runtime.scheduler import build_window_policy

    registries = registries if registries is not None else get_registries()
    return build_window_policy(registries.resolve("window_policy", node, "async.window_policy"))
