"""The DataMixer: draw prompts from several sources in fixed proportions, exactly.

Proportions are apportioned, never sampled. For a draw of ``n`` prompts the mixer:

1. splits ``n`` across sources by largest remainder: source ``s`` gets ``floor(n*w_s)`` or
   ``ceil(n*w_s)``; the leftover seats go to the sources furthest behind their long-run
   share (their carried deficit plus this draw's remainder), so over many draws each
   source's total stays within one prompt of ``total*w_s`` instead of the same sources
   always winning the rounding, as plain Hamilton rounding per batch would do;
2. splits each source's count across ``mini_batches`` equal mini-batches and then each
   mini-batch across ``dp_size`` ranks with McNaughton's wrap-around rule, so every
   mini-batch and every (mini-batch, rank) shard holds ``floor`` or ``ceil`` of its own
   size times ``w_s`` of each source (rounding a rounded count by the same rule cannot leave
   the floor/ceil band of the finer unit);
3. fills each shard from the sources' streams and shuffles the shard by the seed; a record
   its source skips (``SkippedRecord``: the prompt check found it unusable) is replaced by
   the next one of the same stream.

The returned list is laid out mini-batch by mini-batch and, within one, rank by rank, so a
trainer that cuts it into contiguous equal parts gets the guarantee above. Each source's
stream visits its dataset in a fresh seeded permutation every epoch (an unsized, infinite
dataset is read in index order). Everything is a function of the seed and the counters in
``state_dict()``, so a resumed run draws exactly the prompts the original run would have.
Guarantees are per global batch, per mini-batch and per shard; a rank's total over all
mini-batches of a step is not separately balanced (that three-way rounding has no general
solution).
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from loongsage.data.types import Prompt
from loongsage.errors import ConfigError, LoongSageError


class SkippedRecord(LoongSageError):
    """Raised by a source's ``get`` for a record left out of training (counted where raised)."""


class MixableSource(Protocol):
    """What the mixer needs of a data source (``loongsage.data.sources.DataSource``)."""

    name: str
    weight: float

    def size(self) -> int | None: ...

    def get(self, index: int) -> Prompt: ...


def apportion(total: int, shares: Sequence[Fraction], carry: Sequence[Fraction] | None = None) -> list[int]:
    """Largest-remainder split of ``total`` seats by ``shares`` (which sum to 1).

    Every count is ``floor`` or ``ceil`` of ``total*share``. Leftover seats go to the
    largest ``carry + remainder`` (carry defaults to zero: plain Hamilton), ties to the
    earlier source.
    """
    ideal = [total * s for s in shares]
    counts = [math.floor(x) for x in ideal]
    carry = carry or [Fraction(0)] * len(shares)
    eligible = [i for i, x in enumerate(ideal) if x != counts[i]]
    eligible.sort(key=lambda i: (-(carry[i] + ideal[i] - counts[i]), i))
    for i in eligible[: total - sum(counts)]:
        counts[i] += 1
    return counts


def wrap_split(counts: Sequence[int], parts: int, offset: int = 0, *,
               equal: bool = True) -> list[list[int]]:
    """Split a count vector into ``parts`` vectors of equal sum, each cell floor/ceil of ``c/parts``.

    McNaughton's wrap-around rule: the leftover ``c % parts`` items of every source are
    dealt one per part in a single cyclic pass starting at part ``offset``; since each
    source has fewer leftovers than parts, no part gets two of one source. With
    ``equal=False`` a total that does not divide is allowed: the same pass leaves part sums
    that differ by at most one (a filtered batch that came back short).
    """
    if equal and sum(counts) % parts:
        raise ValueError(f"cannot split {sum(counts)} items into {parts} equal parts")
    out = [[c // parts for c in counts] for _ in range(parts)]
    pointer = offset
    for s, c in enumerate(counts):
        for _ in range(c % parts):
            out[pointer % parts][s] += 1
            pointer += 1
    return out


@dataclass
class _Stream:
    """Position of one source's reader: its ``cursor``-th draw, in seeded per-epoch order."""

    key: int  # stable per-source seed component
    size: int | None
    cursor: int = 0
    _epoch: int = -1
    _perm: Any = field(default=None, repr=False)

    def next_index(self, seed: int) -> int:
        position = self.cursor
        self.cursor += 1
        if self.size is None:
            return position
        epoch, offset = divmod(position, self.size)
        if epoch != self._epoch:
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, self.key, epoch])))
            self._perm, self._epoch = rng.permutation(self.size), epoch
        return int(self._perm[offset])


class DataMixer:
    """Draw prompt batches whose per-source proportions are exact in every batch and shard."""

    def __init__(
        self, sources: Sequence[MixableSource], seed: int = 0, mini_batches: int = 1, dp_size: int = 1
    ) -> None:
        if not sources:
            raise ConfigError("data_sources", "the mixer needs at least one data source")
        names = [s.name for s in sources]
        for i, source in enumerate(sources):
            if names.index(source.name) != i:
                raise ConfigError(f"data_sources[{i}].name", f"duplicate data source name {source.name!r}")
            weight = source.weight
            if not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
                raise ConfigError(
                    f"data_sources[{i}].weight",
                    f"expected a positive finite proportion, got {weight!r} (source {source.name!r})",
                )
            if source.size() is not None and source.size() < 1:
                raise ConfigError(f"data_sources[{i}].dataset", f"source {source.name!r} holds no prompts")
        for key, value in (("train.mini_batches_per_step", mini_batches), ("data-parallel size", dp_size)):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(key, f"expected an integer >= 1, got {value!r}")
        raw = [Fraction(s.weight).limit_denominator(10**6) for s in sources]
        self.sources = list(sources)
        self.shares = [w / sum(raw) for w in raw]
        self.seed = seed
        self.mini_batches = mini_batches
        self.dp_size = dp_size
        self._streams = [_Stream(zlib.crc32(s.name.encode()), s.size()) for s in sources]
        self.drawn = 0  # prompts drawn over the run
        self.assigned = [0] * len(sources)  # prompts drawn per source
        self.calls = 0
        self.last_counts: dict[str, int] = {}

    @classmethod
    def from_sources(
        cls,
        sources: Mapping[str, MixableSource] | Sequence[MixableSource],
        seed: int = 0,
        *,
        batch_size: int | None = None,
        mini_batches: int = 1,
        dp_size: int = 1,
    ) -> "DataMixer":
        """Build from ``build_sources``' mapping; check ``batch_size`` now when given."""
        listed = list(sources.values()) if isinstance(sources, Mapping) else list(sources)
        mixer = cls(listed, seed, mini_batches, dp_size)
        if batch_size is not None:
            mixer.check_batch_size(batch_size)
        return mixer

    @property
    def units(self) -> int:
        """Shards per batch: mini-batches times data-parallel ranks."""
        return self.mini_batches * self.dp_size

    def check_batch_size(self, n: int, key: str = "rollout.prompts_per_step") -> None:
        """Raise ``ConfigError`` unless every shard of an ``n``-prompt batch holds every source."""
        if not isinstance(n, int) or n < 1 or n % self.units:
            raise ConfigError(
                key,
                f"{n!r} prompts cannot be cut into {self.mini_batches} mini-batches x {self.dp_size} "
                f"ranks of equal size; use a positive multiple of {self.units}",
            )
        shard = n // self.units
        for source, share in zip(self.sources, self.shares):
            if shard * share < 1:
                need = math.ceil(1 / share) * self.units
                raise ConfigError(
                    key,
                    f"{n} prompts give shards of {shard} ({self.mini_batches} mini-batches x "
                    f"{self.dp_size} ranks), too small for source {source.name!r} (share "
                    f"{float(share):.4g} -> {float(shard * share):.3g} prompts per shard); use at "
                    f"least {need} prompts per step",
                )

    def plan(self, n: int) -> list[list[int]]:
        """Per-shard per-source counts of the next ``n``-prompt draw (shard-major order)."""
        if not isinstance(n, int) or n < 1 or n % self.units:
            raise ValueError(f"draw size {n!r} must be a positive multiple of {self.units} shards")
        carry = [self.drawn * s - a for s, a in zip(self.shares, self.assigned)]
        counts = apportion(n, self.shares, carry)
        shards = []
        for m, mini in enumerate(wrap_split(counts, self.mini_batches, offset=self.calls)):
            shards += wrap_split(mini, self.dp_size, offset=self.calls + m)
        return shards

    def next_prompts(self, n: int) -> list[Prompt]:
        """Draw the next ``n`` prompts, shard by shard (see the module docstring)."""
        shards = self.plan(n)
        prompts: list[Prompt] = []
        for u, counts in enumerate(shards):
            shard = [self._draw(s) for s, c in enumerate(counts) for _ in range(c)]
            random.Random(f"mixer:{self.seed}:{self.calls}:{u}").shuffle(shard)
            prompts += shard
        totals = [sum(col) for col in zip(*shards)]
        self.assigned = [a + t for a, t in zip(self.assigned, totals)]
        self.drawn += n
        self.calls += 1
        self.last_counts = {s.name: t for s, t in zip(self.sources, totals)}
        return prompts

    def _draw(self, s: int) -> Prompt:
        """The next prompt of source ``s``; a record the source skips (``SkippedRecord``: found
        bad by the prompt check, already counted) gives way to the one after it."""
        source, stream = self.sources[s], self._streams[s]
        for _ in range(stream.size or 1):
            try:
                return source.get(stream.next_index(self.seed))
            except SkippedRecord:
                continue
        raise ConfigError(f"data_sources[{s}].dataset", f"every record of source {source.name!r} "
                          "was skipped as unusable (see the warnings above)")

    def state_dict(self) -> dict[str, Any]:
        """Plain-data counters; with the same sources and seed they reproduce every later draw."""
        return {
            "seed": self.seed,
            "sources": [s.name for s in self.sources],
            "shares": [str(s) for s in self.shares],
            "drawn": self.drawn,
            "assigned": list(self.assigned),
            "cursors": [st.cursor for st in self._streams],
            "calls": self.calls,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue where ``state`` stopped. Changed weights restart the long-run balance."""
        names = [s.name for s in self.sources]
        if list(state["sources"]) != names:
            raise ConfigError(
                "data_sources",
                f"the checkpoint's mixer drew from {list(state['sources'])}, this run has {names}",
            )
        if state["seed"] != self.seed:
            raise ConfigError(
                "trainer.seed", f"the checkpoint's mixer used seed {state['seed']}, this run {self.seed}"
            )
        for stream, cursor in zip(self._streams, state["cursors"]):
            stream.cursor = int(cursor)
        self.calls = int(state["calls"])
        if [str(s) for s in self.shares] == list(state["shares"]):
            self.drawn, self.assigned = int(state["drawn"]), [int(a) for a in state["assigned"]]
        else:
            self.drawn, self.assigned = 0, [0] * len(self.sources)
