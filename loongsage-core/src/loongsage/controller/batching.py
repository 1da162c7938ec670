"""Turn scored prompt groups into one right-padded ``TrainBatch`` and per-step statistics.

Token alignment follows ``loongsage.engines.batch``: a row is prompt + response, and every
per-token array of a sample (rollout logprobs, weight versions, loss mask) lands at the
positions of the response tokens it describes.
"""

from __future__ import annotations

from typing import Sequence

import torch

from loongsage.data.types import Group
from loongsage.engines.batch import TrainBatch


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
    batch = TrainBatch(
        input_ids,
        attention,
        loss_mask,
        {"rollout_logprobs": rollout_logprobs, "weight_versions": versions},
    )
    return batch, rewards, group_index


def attach_train_logprobs(groups: Sequence[Group], logprobs: torch.Tensor) -> None:
    """Set ``train_logprobs`` of the first ``len(logprobs)`` samples from their batch rows."""
    samples = [s for g in groups for s in g.samples]
    for row, sample in zip(range(logprobs.shape[0]), samples):
        p, r = len(sample.prompt_ids), len(sample.response_ids)
        sample.train_logprobs = logprobs[row, p : p + r].tolist()


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
    numeric = {k for s in samples for k, v in s.reward_info.items() if isinstance(v, (bool, int, float))}
    for key in sorted(numeric):
        values = [float(s.reward_info.get(key, 0.0)) for s in samples]
        metrics[f"rollout/{key}_mean"] = sum(values) / len(values)
    for source in sorted({g.prompt.source for g in groups}):
        chosen = [s.reward for g in groups if g.prompt.source == source for s in g.samples]
        metrics[f"rollout/reward_mean/{source}"] = sum(chosen) / len(chosen)
    return metrics
