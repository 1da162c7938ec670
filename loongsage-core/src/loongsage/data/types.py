"""The records that flow from rollout to training.

A ``Sample`` is one generated response with everything training needs, token-aligned: the
sampled ids, the engine's logprob for each, the weight version that sampled each token
(partial rollout mixes versions), and the loss mask. ``train_logprobs``, ``advantages`` and
``values`` are filled after the step for the samples the run directory saves: the trainer's
logprob of each response token at step start (pi_old), so a saved trajectory shows the
train/inference gap per token, the advantage each token was trained with, and the value
V(s_t) of each token when a values-based estimator read one (``controller.batching.attach_rows``). On an
MoE model ``routed_experts`` holds the rollout's routes in ``loongsage.engines.routing``'s record
format (``[prompt + response tokens, layers, top_k]``, -1 where none), for router replay (R3). A ``Group`` is the G samples drawn for
one prompt; advantages are computed within a group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Prompt:
    """One prompt drawn from a data source."""

    source: str  # data source name
    index: int  # position in the data source's stream (for resume and dedup)
    messages: list[dict[str, Any]]  # chat messages
    ground_truth: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Sample:
    """One trajectory (or one trainable segment of it), token in / token out."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float]  # rollout engine logprob of each response token
    weight_versions: list[int]  # policy version that sampled each response token
    loss_mask: list[int]  # 1 = trained (model-sampled); 0 = tool output / template / masked
    finish_reason: str = "stop"  # stop | length | abort
    reward: float = 0.0
    reward_info: dict[str, Any] = field(default_factory=dict)
    text: str = ""  # decoded response, for logs and trajectory samples
    train_logprobs: list[float] = field(default_factory=list)  # pi_old per response token, if kept
    advantages: list[float] = field(default_factory=list)  # advantage per response token, if kept
    values: list[float] = field(default_factory=list)  # the baseline V(s_t) per response token, if kept
    routed_experts: Any = None  # numpy [prompt + response tokens, layers, top_k] int16, MoE only
    sampling_seed: int | None = None  # the seed its tokens were drawn with (``engines.sampling_seed``)

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        for name in ("response_logprobs", "weight_versions", "loss_mask"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"Sample.{name} has {len(getattr(self, name))} entries for {n} response tokens"
                )
        if self.routed_experts is not None:
            self.routed_experts = np.asarray(self.routed_experts, dtype=np.int16)
            total = len(self.prompt_ids) + n
            if self.routed_experts.ndim != 3 or len(self.routed_experts) != total:
                raise ValueError(f"Sample.routed_experts has shape {self.routed_experts.shape}; "
                                 f"expected [{total} tokens, layers, top_k]")

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @property
    def awaits_continuation(self) -> bool:
        """Aborted at a weight update with its tokens kept (partial rollout); a failed
        trajectory (``reward_info["failed"]``, which router samples also mark ``abort``) is not."""
        return self.finish_reason == "abort" and not self.reward_info.get("failed")


@dataclass
class Group:
    """The samples generated for one prompt; the unit of dispatch, collection and advantage."""

    group_id: int  # dispatch sequence number, unique within a run
    prompt: Prompt
    samples: list[Sample] = field(default_factory=list)
    dispatch_version: int = 0  # policy version when the group was dispatched

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]

    def min_version(self) -> int:
        versions = [v for s in self.samples for v in s.weight_versions]
        return min(versions) if versions else self.dispatch_version
