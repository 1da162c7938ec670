"""The tensors a train engine consumes, and what it hands a loss closure.

``TrainBatch`` rows are whole sequences (prompt + response), right-padded. Every per-token
tensor is aligned with ``input_ids``: position t describes token t, and the log-probability
at t is log p(input_ids[t] | input_ids[:t]) (position 0 has none and is never in the loss
mask). ``extras`` carries any further per-token ([N, L]) or per-sequence ([N]) tensors
(``old_logprobs``, ``rollout_logprobs``, ``advantages``, ``ref_logprobs``, ...) and is
sliced together with the rows when the engine splits micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass
class TrainBatch:
    input_ids: torch.Tensor  # [N, L] long
    attention_mask: torch.Tensor  # [N, L] long/bool
    loss_mask: torch.Tensor  # [N, L] float, 1 on trained tokens
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, index: slice | torch.Tensor) -> "TrainBatch":
        """A batch holding only the selected rows (micro-batches, DP shards)."""
        return TrainBatch(
            self.input_ids[index],
            self.attention_mask[index],
            self.loss_mask[index],
            {k: v[index] for k, v in self.extras.items()},
        )


@dataclass(frozen=True)
class LogitTerm:
    """Values a loss needs from the policy's full-vocabulary logits, computed in the LM head.

    The train engine never holds a micro-batch's ``[tokens, vocab]`` logits at once: it runs
    the LM head over chunks of positions. A ``LogitTerm`` is evaluated inside that loop:
    ``fn(logits [c, V] fp32, *inputs) -> [c, width]`` for each chunk of ``c`` predicted
    positions, where each input is the chunk's rows of ``TrainBatch.extras[key]`` for the keys
    in ``inputs`` (a per-token ``[N, L, ...]`` tensor is read at the predicted token's
    position, a per-row ``[N]`` one is repeated over the row's positions). ``fn`` must not
    modify ``logits`` in place; with grad enabled a chunk may be recomputed in the backward
    (activation checkpointing), so it must be deterministic. The results come back aligned
    with ``input_ids`` like log-probs: ``[N, L, width]``, zero at position 0 and at padding.
    """

    fn: Callable[..., torch.Tensor]
    inputs: tuple[str, ...] = ()
    width: int = 1


@dataclass
class LossContext:
    """What a loss closure receives for one micro-batch.

    ``global_num_tokens`` / ``global_num_seqs`` count the valid tokens / sequences of the
    whole mini-batch across micro-batches and data-parallel ranks, so a closure that divides
    by them gives a result independent of how the mini-batch was split. ``logit_values`` are
    the closure's ``logit_term`` results for this micro-batch (``[N, L, width]``, with grad),
    when it declares one.
    """

    batch: TrainBatch
    logprobs: torch.Tensor  # [N, L], requires grad
    entropy: torch.Tensor | None  # [N, L] or None
    global_num_tokens: float
    global_num_seqs: float
    logit_values: torch.Tensor | None = None  # [N, L, width] or None
