"""The train-actor half of the training-step seam: what a step term adds inside the train actor.

A step term plugin (kind ``step_term``, ``loongsage.config.step_terms``) that is active in a
run builds, on the controller side, an extension whose ``train_term`` travels, pickled, into
the train actor inside the ``TrainStep`` (``loongsage.controller.train_step``). There the step
calls it at four points:

1. the π_old forward, with ``old_logit_term`` (values the term needs from the policy's
   full-vocabulary logits before the loss, or None) and ``needs_entropy``;
2. ``shape_advantages(batch, advantages, old)`` right after the advantage estimator, with
   ``old`` the π_old forward's outputs (``logprobs``, ``entropy``, ``logit_values``): e.g. a
   penalty ``Â_t = A_t − λ·sg(D_t)``;
3. every micro-batch of the train forward, with ``logit_term``: ``loss(ctx)`` returns the
   term's weighted share of the loss and its metrics, additive shares like the objective's;
4. ``finish_metrics(metrics)`` on the step's metrics summed over micro-batches and ranks (to
   turn sums into means).

``rl_weight`` scales the RL loss; at 0 the π_old forward, the advantages and the RL loss are
skipped altogether. Both ``LogitTerm``s are evaluated inside the engine's chunked LM head
(``loongsage.engines.batch``), so no micro-batch's logits exist at once.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from loongsage.engines.batch import LogitTerm, LossContext, TrainBatch


class StepTerm(Protocol):
    """The train-side half of a step term (module docstring)."""

    rl_weight: float
    needs_entropy: bool
    old_logit_term: LogitTerm | None
    logit_term: LogitTerm | None

    def shape_advantages(
        self, batch: TrainBatch, advantages: torch.Tensor, old: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]: ...

    def loss(self, ctx: LossContext) -> tuple[torch.Tensor, dict[str, float]]: ...

    def finish_metrics(self, metrics: dict[str, Any]) -> dict[str, float]: ...
