"""What a distiller adds inside the train actor: the contract of its ``DistillTerm``.

A distiller plugin (``loongsage_register_distillers``, docs/plugins.md) writes its teachers'
outputs for each training batch into ``TrainBatch.extras`` on the controller side, and hands
the objective a ``DistillTerm`` that travels, pickled, into the train actor with it. There
``train_on_rollout`` and the ``Objective`` call it at four points:

1. the π_old forward, with ``pg_logit_term`` (values the advantage penalty needs from the
   policy's full-vocabulary logits, or None) and ``needs_entropy``;
2. ``shape_advantages(batch, advantages, old)`` right after the advantage estimator: the
   PG-style penalty ``Â_t = A_t − λ_pg·sg(KL_t)``, with ``old`` the π_old forward's outputs
   (``logprobs``, ``entropy``, ``logit_values``);
3. every micro-batch of the train forward, with ``logit_term``: ``loss(ctx)`` returns the
   term's weighted share of the loss (``λ_gkd·L_GKD``) and its metrics, additive shares like
   the objective's;
4. ``finish_metrics(metrics)`` on the step's summed metrics (to turn per-source sums into
   means).

``rl_weight`` scales the RL loss (``1 − λ_gkd``); at 0 the π_old forward, the advantages and
the RL loss are skipped altogether. Both ``LogitTerm``s are evaluated inside the engine's
chunked LM head (``loongsage.engines.batch``), so no micro-batch's logits exist at once.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from loongsage.engines.batch import LogitTerm, LossContext, TrainBatch


class DistillTerm(Protocol):
    """The train-side half of a distiller (module docstring)."""

    rl_weight: float
    needs_entropy: bool
    pg_logit_term: LogitTerm | None
    logit_term: LogitTerm | None

    def shape_advantages(
        self, batch: TrainBatch, advantages: torch.Tensor, old: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]: ...

    def loss(self, ctx: LossContext) -> tuple[torch.Tensor, dict[str, float]]: ...

    def finish_metrics(self, metrics: dict[str, Any]) -> dict[str, float]: ...
