"""Turn scored prompt groups into one right-padded ``TrainBatch``, cut it into the shards the
train ranks train, and compute per-step statistics.

Token alignment follows ``loongsage.engines.batch``: a row is prompt + response, and every
per-token array of a sample (rollout logprobs, weight versions, loss mask) lands at the
positions of the response tokens it describes, and a step's per-token results come back
the same way (``attach_rows``: the rows of the saved samples, sliced at their response
positions, whatever versions sampled the tokens). Samples with MoE routes add
``extras["routed_experts"]`` ``[N, L, layers, top_k]`` (the whole row: prompt and response;
``engines.routing.NO_ROUTE`` at padding and wherever a sample has none).

Shards (``plan_shards``): the step's groups are split per source over the mini-batches and
then each mini-batch over the data-parallel ranks with the mixer's wrap-around rule
(``data.mixer.wrap_split``), so every mini-batch and every (mini-batch, rank) shard holds
floor or ceil of its share of every source, whatever order the groups arrived in; a group's
samples stay in one shard. Within a source, groups are taken in ``group_id`` order, so a
mini-batch holds the same groups for every ``dp_size``.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from loongsage.data.mixer import wrap_split
from loongsage.data.types import Group, Sample
from loongsage.engines.batch import TrainBatch
from loongsage.engines.distributed import RankShards
from loongsage.engines.routing import NO_ROUTE, ROUTE_DTYPE


def groups_to_batch(groups: Sequence[Group], pad_id: int) -> tuple[TrainBatch, torch.Tensor, torch.Tensor]:
    """Return the batch, per-sample rewards [N] and per-sample group index [N]."""
    samples = [(g, s) for g in groups for s in g.samples]
    if not samples:
        raise ValueError("cannot build a training batch from zero samples")
    length = max(len(s.prompt_ids) + len(s.response_ids) for _, s in samples)
    n = len(samples)
    input_ids = torch.full((n, length), pad_id, dtype=torch.long)
    attention = torch.zeros((n, length), dtype=torch.long)
    loss_mask = torch.zeros((n, length), dtype=torch.float32)
    rollout_logprobs = torch.zeros((n, length), dtype=torch.float32)
    versions = torch.full((n, length), -1, dtype=torch.long)
    for row, (_, sample) in enumerate(samples):
        p, r = len(sample.prompt_ids), len(sample.response_ids)
        input_ids[row, : p + r] = torch.tensor(sample.prompt_ids + sample.response_ids)
        attention[row, : p + r] = 1
        loss_mask[row, p : p + r] = torch.tensor(sample.loss_mask, dtype=torch.float32)
        rollout_logprobs[row, p : p + r] = torch.tensor(sample.response_logprobs)
        versions[row, p : p + r] = torch.tensor(sample.weight_versions)
    rewards = torch.tensor([s.reward for _, s in samples], dtype=torch.float32)
    group_index = torch.tensor([g.group_id for g, _ in samples], dtype=torch.long)
    extras = {"rollout_logprobs": rollout_logprobs, "weight_versions": versions}
    routes = [s.routed_experts for _, s in samples]
    if any(r is not None for r in routes):
        extras["routed_experts"] = _routes_batch(routes, length)
    batch = TrainBatch(input_ids, attention, loss_mask, extras)
    return batch, rewards, group_index


def _routes_batch(routes: list, length: int) -> torch.Tensor:
    """Samples' routes right-padded into ``[N, L, layers, top_k]``; NO_ROUTE where there is none."""
    shape = next(r.shape[1:] for r in routes if r is not None)
    out = torch.full((len(routes), length, *shape), NO_ROUTE, dtype=ROUTE_DTYPE)
    for row, r in enumerate(routes):
        if r is not None:
            out[row, : len(r)] = torch.from_numpy(r)
    return out


PER_TOKEN_RESULTS = ("train_logprobs", "advantages", "values")  # Sample fields a step fills


def attach_rows(samples: Sequence[Sample], rows: Mapping[str, torch.Tensor]) -> None:
    """Set each sample's per-token results (``PER_TOKEN_RESULTS``: pi_old logprobs, advantages,
    a step term's values) from row i of ``rows[name]`` [len(samples), L] (batch layout: prompt,
    then response), one entry per response token."""
    unknown = set(rows) - set(PER_TOKEN_RESULTS)
    if unknown:
        raise ValueError(f"attach_rows: {sorted(unknown)} are not per-token sample fields {PER_TOKEN_RESULTS}")
    for name, tensor in rows.items():
        if len(tensor) != len(samples):
            raise ValueError(f"attach_rows: {name} has {len(tensor)} rows for {len(samples)} samples")
        for row, sample in enumerate(samples):
            p, r = len(sample.prompt_ids), len(sample.response_ids)
            setattr(sample, name, tensor[row, p : p + r].tolist())


def plan_shards(groups: Sequence[Group], sources: Sequence[str], mini_batches: int,
                dp_size: int, offset: int = 0) -> tuple[list[Group], RankShards]:
    """The groups in shard order (mini-batch by mini-batch, rank by rank) and each rank's rows.

    The batch built from the returned order has rows shard after shard; every shard is
    padded to the longest one (``RankShards.pad``) so ranks take equal steps. ``offset``
    (the step) rotates which shards get a source's leftover group. A batch with fewer groups
    than ``mini_batches`` takes one optimizer step per group.
    """
    queues = {name: sorted((g for g in groups if g.prompt.source == name),
                           key=lambda g: g.group_id) for name in sources}
    unknown = {g.prompt.source for g in groups} - set(sources)
    if unknown:
        raise ValueError(f"groups from unknown data sources {sorted(unknown)}")
    minis = max(1, min(mini_batches, len(groups)))
    cursor = dict.fromkeys(sources, 0)
    shards: list[list[Group]] = []
    for m, mini in enumerate(wrap_split([len(queues[s]) for s in sources], minis, offset,
                                        equal=False)):
        for part in wrap_split(mini, dp_size, offset + m, equal=False):
            shard = []
            for name, count in zip(sources, part):
                shard += queues[name][cursor[name]:cursor[name] + count]
                cursor[name] += count
            shards.append(shard)
    ordered = [g for shard in shards for g in shard]
    rows, start = [], 0
    for shard in shards:
        size = sum(len(g.samples) for g in shard)
        rows.append(list(range(start, start + size)))
        start += size
    width = max(len(r) for r in rows)
    index = [[] for _ in range(dp_size)]
    pad = [[] for _ in range(dp_size)]
    for u, shard_rows in enumerate(rows):
        rank = u % dp_size
        index[rank] += shard_rows + [0] * (width - len(shard_rows))
        pad[rank] += [False] * len(shard_rows) + [True] * (width - len(shard_rows))
    return ordered, RankShards([torch.tensor(i, dtype=torch.long) for i in index],
                               [torch.tensor(p, dtype=torch.bool) for p in pad], minis)


def rollout_metrics(groups: Sequence[Group]) -> dict[str, float]:
    """Reward, length and per-reward-field statistics of the step's samples."""
    samples = [s for g in groups for s in g.samples]
    rewards = torch.tensor([s.reward for s in samples])
    lengths = torch.tensor([len(s.response_ids) for s in samples], dtype=torch.float32)
    metrics = {
        "rollout/reward_mean": rewards.mean().item(),
        "rollout/reward_std": rewards.std().item() if len(samples) > 1 else 0.0,
        "rollout/response_length_mean": lengths.mean().item(),
        "rollout/response_length_max": lengths.max().item(),
        "rollout/truncated_ratio": sum(s.truncated for s in samples) / len(samples),
        "rollout/num_samples": float(len(samples)),
        "rollout/zero_variance_group_ratio": sum(
            len(set(g.rewards)) <= 1 for g in groups
        ) / max(len(groups), 1),
    }
    # a field missing from a sample, or not a number there (None: a killed program's exit code,
    # a root segment's parent), counts as 0
    numeric = {k for s in samples for k, v in s.reward_info.items() if isinstance(v, (bool, int, float))}
    for key in sorted(numeric):
        values = [float(v) if isinstance(v := s.reward_info.get(key), (bool, int, float)) else 0.0
                  for s in samples]
        metrics[f"rollout/{key}_mean"] = sum(values) / len(values)
    for source in sorted({g.prompt.source for g in groups}):
        chosen = [s.reward for g in groups if g.prompt.source == source for s in g.samples]
        metrics[f"rollout/reward_mean/{source}"] = sum(chosen) / len(chosen)
        metrics.update(episode_metrics(source, [s for g in groups if g.prompt.source == source for s in g.samples]))
    return metrics


def episode_metrics(source: str, samples: Sequence[Sample]) -> dict[str, float]:
    """``rollout/<metric>_mean/<source>``: each metric an environment's episodes reported
    (``reward_info["episode_metrics"]``), averaged over the episodes that reported it."""
    reported = [m for s in samples if isinstance(m := s.reward_info.get("episode_metrics"), dict)]
    out = {}
    for name in sorted({k for m in reported for k in m}):
        values = [float(m[name]) for m in reported if name in m]
        out[f"rollout/{name}_mean/{source}"] = sum(values) / len(values)
    return out
