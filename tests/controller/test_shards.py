"""A step's groups cut into (mini-batch, rank) shards: exact source shares, whole groups.

``plan_shards`` is checked on groups delivered in random order, against the DataMixer's own
promise (every mini-batch and every shard holds floor or ceil of its share of each source),
for batches the mixer draws and for short batches a filter left behind.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loongsage.controller.batching import groups_to_batch, plan_shards
from loongsage.data.mixer import DataMixer
from loongsage.data.types import Group, Prompt, Sample
from loongsage.engines.distributed import RankShards, combine_rank_metrics


def group(gid: int, source: str, samples: int = 2) -> Group:
    made = [Sample([1, 2], [3] * (1 + (gid + i) % 4), [0.0] * (1 + (gid + i) % 4),
                   [0] * (1 + (gid + i) % 4), [1] * (1 + (gid + i) % 4)) for i in range(samples)]
    return Group(gid, Prompt(source, gid, []), made)


def shard_groups(ordered: list[Group], shards: RankShards) -> dict[tuple[int, int], list[int]]:
    """(mini-batch, rank) -> group ids, read back from the row indices."""
    row_group = [g.group_id for g in ordered for _ in g.samples]
    width = len(shards.index[0]) // shards.mini_batches
    out = {}
    for rank, (index, pad) in enumerate(zip(shards.index, shards.pad)):
        for m in range(shards.mini_batches):
            rows = index[m * width:(m + 1) * width][~pad[m * width:(m + 1) * width]]
            out[(m, rank)] = sorted({row_group[r] for r in rows.tolist()})
    return out


def check_plan(groups: list[Group], sources: list[str], minis: int, dp: int) -> None:
    ordered, shards = plan_shards(groups, sources, minis, dp, offset=3)
    by_id = {g.group_id: g for g in groups}
    assert sorted(g.group_id for g in ordered) == sorted(by_id)  # every group once
    lengths = {len(i) for i in shards.index}
    assert len(lengths) == 1 and lengths.pop() % shards.mini_batches == 0  # equal steps per rank
    cells = shard_groups(ordered, shards)
    seen = [gid for ids in cells.values() for gid in ids]
    assert sorted(seen) == sorted(by_id)  # each group's samples in exactly one shard
    real_rows = sum(int((~pad).sum()) for pad in shards.pad)
    assert real_rows == sum(len(g.samples) for g in groups)  # padding is all that was added
    total = Counter(g.prompt.source for g in groups)
    for m in range(shards.mini_batches):
        mini = Counter(by_id[i].prompt.source for r in range(dp) for i in cells[(m, r)])
        for source in sources:
            ideal = total[source] / shards.mini_batches
            assert math.floor(ideal) <= mini[source] <= math.ceil(ideal), (m, source)
            for r in range(dp):
                cell = sum(by_id[i].prompt.source == source for i in cells[(m, r)])
                assert math.floor(mini[source] / dp) <= cell <= math.ceil(mini[source] / dp)
                full = total[source] / (shards.mini_batches * dp)
                if len(groups) % (shards.mini_batches * dp) == 0:  # a full batch: the finer band
                    assert math.floor(full) <= cell <= math.ceil(full), (m, r, source)


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 9), min_size=1, max_size=3), minis=st.integers(1, 3),
       dp=st.integers(1, 3), seed=st.integers(0, 1000))
def test_shards_hold_every_source_share_in_every_mini_batch_and_rank(counts, minis, dp, seed):
    sources = [f"s{i}" for i in range(len(counts))]
    groups: list[Group] = []
    gid = 0
    for source, count in zip(sources, counts):
        for _ in range(count):
            groups.append(group(gid, source, samples=1 + gid % 3))
            gid += 1
    if not groups:
        return
    random.Random(seed).shuffle(groups)
    check_plan(groups, sources, minis, dp)


def test_mixer_batches_split_exactly_per_rank_and_mini_batch():
    """Prompts drawn by a mixer built with the real dp_size and mini-batches, generated out of
    order, land in shards with the shares the mixer promises (weights 3:1, 16 groups)."""
    sources = [SimpleNamespace(name=name, weight=weight, size=lambda: 100,
                               get=lambda i, name=name: Prompt(name, i, []))
               for name, weight in (("a", 3.0), ("b", 1.0))]
    mixer = DataMixer.from_sources(sources, 0, batch_size=16, mini_batches=2, dp_size=2)
    for step in range(3):
        prompts = mixer.next_prompts(16)
        groups = [Group(100 * step + i, p, [Sample([1], [2], [0.0], [0], [1])])
                  for i, p in enumerate(prompts)]
        random.Random(step).shuffle(groups)
        ordered, shards = plan_shards(groups, ["a", "b"], 2, 2, offset=step)
        cells = shard_groups(ordered, shards)
        by_id = {g.group_id: g for g in groups}
        for ids in cells.values():
            assert Counter(by_id[i].prompt.source for i in ids) == {"a": 3, "b": 1}


def test_mini_batches_hold_the_same_groups_for_any_dp_size():
    groups = [group(i, "ab"[i % 2]) for i in range(12)]
    random.Random(1).shuffle(groups)
    minis = {}
    for dp in (1, 2, 3):
        ordered, shards = plan_shards(groups, ["a", "b"], 2, dp)
        cells = shard_groups(ordered, shards)
        minis[dp] = [sorted(i for r in range(dp) for i in cells[(m, r)]) for m in range(2)]
    assert minis[1] == minis[2] == minis[3]


def test_a_short_batch_pads_shards_with_masked_rows():
    groups = [group(i, "a", samples=2) for i in range(3)]  # 3 groups, 2 ranks, 1 mini-batch
    ordered, shards = plan_shards(groups, ["a"], 1, 2)
    assert [len(i) for i in shards.index] == [4, 4]
    assert shards.pad[1].tolist() == [False, False, True, True]
    batch, _, _ = groups_to_batch(ordered, pad_id=0)
    local = shards.local_batch(batch, 1)
    assert local.loss_mask[2:].sum() == 0 and local.loss_mask[:2].sum() > 0
    parts = [torch.arange(4.0) + 10 * r for r in range(2)]  # what each rank computed per row
    placed = shards.place(parts, len(batch))
    assert placed.tolist() == [0.0, 1.0, 2.0, 3.0, 10.0, 11.0]  # pads discarded


def test_a_batch_with_fewer_groups_than_mini_batches_steps_once_per_group():
    _, shards = plan_shards([group(0, "a"), group(1, "a")], ["a"], 4, 1)
    assert shards.mini_batches == 2


def test_unknown_source_is_refused():
    with pytest.raises(ValueError, match="unknown data sources"):
        plan_shards([group(0, "zzz")], ["a"], 1, 1)


def test_rank_metrics_sum_shares_and_keep_global_values():
    ranks = [{"train/loss": 0.25, "train/pg_loss": 0.5, "train/grad_norm": 2.0, "train/lr": 1e-3,
              "train/num_tokens": 40.0, "train/optimizer_steps": 2.0},
             {"train/loss": 0.5, "train/pg_loss": -0.25, "train/grad_norm": 2.0, "train/lr": 1e-3,
              "train/num_tokens": 40.0, "train/optimizer_steps": 2.0, "train/extra": 1.0}]
    assert combine_rank_metrics(ranks) == {
        "train/loss": 0.75, "train/pg_loss": 0.25, "train/grad_norm": 2.0, "train/lr": 1e-3,
        "train/num_tokens": 40.0, "train/optimizer_steps": 2.0, "train/extra": 1.0}
