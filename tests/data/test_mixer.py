"""DataMixer: exact proportions per batch, mini-batch and shard; determinism; resume; errors."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings, strategies as st

from loongsage.data.mixer import DataMixer, apportion, wrap_split
from loongsage.data.types import Prompt
from loongsage.errors import ConfigError


class ListSource:
    """A finite in-memory source; prompt ``i`` of source ``name`` is recognisable by content."""

    def __init__(self, name: str, weight: float, size: int | None = 1000) -> None:
        self.name, self.weight, self._size = name, weight, size

    def size(self) -> int | None:
        return self._size

    def get(self, index: int) -> Prompt:
        return Prompt(self.name, index, [{"role": "user", "content": f"{self.name}#{index}"}])


def sources(weights, sizes=None):
    sizes = sizes or [1000] * len(weights)
    return [ListSource(f"s{i}", w, n) for i, (w, n) in enumerate(zip(weights, sizes))]


def counts(prompts, names):
    return [sum(p.source == n for p in prompts) for n in names]


def within_band(observed, n, shares):
    return all(math.floor(n * s) <= c <= math.ceil(n * s) for c, s in zip(observed, shares))


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.floats(0.05, 10.0), min_size=1, max_size=5),
    mini_batches=st.integers(1, 4),
    dp_size=st.integers(1, 4),
    shard=st.integers(1, 6),
    seed=st.integers(0, 2**31),
)
def test_proportions_hold_in_every_batch_minibatch_and_shard(weights, mini_batches, dp_size, shard, seed):
    mixer = DataMixer(sources(weights), seed, mini_batches, dp_size)
    names = [s.name for s in mixer.sources]
    shares = [w / sum(weights) for w in weights]
    n = shard * mini_batches * dp_size
    for _ in range(5):
        batch = mixer.next_prompts(n)
        assert len(batch) == n
        assert within_band(counts(batch, names), n, shares)
        mini = n // mini_batches
        for m in range(mini_batches):
            mb = batch[m * mini : (m + 1) * mini]
            assert within_band(counts(mb, names), mini, shares)
            for r in range(dp_size):
                part = mb[r * shard : (r + 1) * shard]
                assert within_band(counts(part, names), shard, shares)
    # long-run balance: every source within one prompt of its ideal total
    total = mixer.drawn
    for a, s in zip(mixer.assigned, shares):
        assert abs(a - total * s) < 1 + 1e-9


def test_awkward_weights_exact_numbers():
    mixer = DataMixer(sources([1, 1, 1]), seed=0)
    draws = [mixer.next_prompts(4) for _ in range(3)]
    per_draw = [counts(d, ["s0", "s1", "s2"]) for d in draws]
    # 4 seats over three equal sources: one source gets 2, and the extra seat rotates
    assert all(sorted(c) == [1, 1, 2] for c in per_draw)
    assert [sum(col) for col in zip(*per_draw)] == [4, 4, 4]


def test_apportion_and_wrap_split_primitives():
    shares = [Fraction(1, 2), Fraction(1, 3), Fraction(1, 6)]
    assert apportion(7, shares) == [4, 2, 1]  # ideals 3.5, 2.33, 1.17: largest remainder to s0
    assert apportion(6, shares) == [3, 2, 1]
    assert wrap_split([5, 3, 2], 2) == [[3, 1, 1], [2, 2, 1]]
    parts = wrap_split([7, 5, 0, 3], 3, offset=1)
    assert [sum(p) for p in parts] == [5, 5, 5]
    assert all(c in (c0 // 3, -(-c0 // 3)) for p in parts for c, c0 in zip(p, [7, 5, 0, 3]))


def test_each_epoch_is_a_seeded_permutation():
    mixer = DataMixer(sources([1], sizes=[10]), seed=5)
    first = [p.index for p in mixer.next_prompts(10)]
    second = [p.index for p in mixer.next_prompts(10)]
    assert sorted(first) == list(range(10)) and sorted(second) == list(range(10))
    assert first != second  # a fresh shuffle per epoch
    other = DataMixer(sources([1], sizes=[10]), seed=6)
    assert [p.index for p in other.next_prompts(10)] != first


def test_infinite_source_reads_in_index_order():
    mixer = DataMixer(sources([1], sizes=[None]), seed=0)
    assert sorted(p.index for p in mixer.next_prompts(5)) == [0, 1, 2, 3, 4]
    assert sorted(p.index for p in mixer.next_prompts(5)) == [5, 6, 7, 8, 9]


def draw(mixer, steps, n):
    return [[(p.source, p.index) for p in mixer.next_prompts(n)] for _ in range(steps)]


def test_same_seed_same_batches_and_resume_continues_exactly():
    weights, sizes = [3, 2, 0.5], [7, 11, 5]
    reference = draw(DataMixer(sources(weights, sizes), 11, 2, 2), 9, 24)
    assert reference == draw(DataMixer(sources(weights, sizes), 11, 2, 2), 9, 24)
    first = DataMixer(sources(weights, sizes), 11, 2, 2)
    head = draw(first, 4, 24)
    state = first.state_dict()
    import json

    state = json.loads(json.dumps(state))  # survives a checkpoint file
    resumed = DataMixer(sources(weights, sizes), 11, 2, 2)
    resumed.load_state_dict(state)
    assert head + draw(resumed, 5, 24) == reference


def test_resume_rejects_other_sources_or_seed():
    state = DataMixer(sources([1, 2]), 0).state_dict()
    with pytest.raises(ConfigError, match="data_sources"):
        DataMixer(sources([1, 2, 3]), 0).load_state_dict(state)
    with pytest.raises(ConfigError, match="trainer.seed"):
        DataMixer(sources([1, 2]), 1).load_state_dict(state)


@pytest.mark.parametrize("weight", [0, -1.0, float("nan"), float("inf")])
def test_bad_weight_names_the_source(weight):
    with pytest.raises(ConfigError, match=r"data_sources\[1\]\.weight: expected a positive finite"):
        DataMixer(sources([1, weight]), 0)


def test_batch_too_small_for_a_share():
    with pytest.raises(ConfigError, match=r"rollout.prompts_per_step: 8 prompts give shards of 4.*'s1'.*at least 20"):
        DataMixer.from_sources(sources([9, 1]), 0, batch_size=8, mini_batches=2)
    DataMixer.from_sources(sources([9, 1]), 0, batch_size=20, mini_batches=2)
    with pytest.raises(ConfigError, match="multiple of 6"):
        DataMixer.from_sources(sources([1]), 0, batch_size=8, mini_batches=2, dp_size=3)


def test_duplicate_names_and_empty_sources():
    with pytest.raises(ConfigError, match=r"data_sources\[1\]\.name"):
        DataMixer([ListSource("a", 1), ListSource("a", 1)])
    with pytest.raises(ConfigError, match="at least one"):
        DataMixer([])
