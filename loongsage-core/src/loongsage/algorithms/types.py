"""The records passed to algorithm plugins: one input and one output type per kind.

Callable contracts (each registered object honours one; documented in docs/algorithms.md):

    advantage      fn(inputs: AdvantageInputs, params) -> Tensor [N, L]
    policy_loss    fn(inputs: PolicyLossInputs, params) -> PolicyLossOutput
    is_correction  fn(inputs: PolicyLossInputs, params) -> Correction
    kl_policy      fn(logprobs [N, L], ref_logprobs [N, L]) -> Tensor [N, L]
    data_filter    fn(groups: list[Group], params) -> FilterResult   (loongsage.algorithms.filters)

A policy loss or correction needing a statistic of the *whole* mini-batch (M2PO's second
moment) sets ``fn.prepare = prep`` with ``prep(inputs: PolicyLossInputs, params) ->
dict[str, Tensor]``: ``Objective.prepare(batch)`` calls it once on the full batch (with
``logprobs`` = ``old_logprobs``) and stores the [N, L] / [N] tensors in ``batch.extras``,
which are sliced with the rows into micro-batches and reach the loss as ``inputs.extras``.

An advantage estimator that reads per-token values (``AdvantageInputs.values``, ``gae``)
declares ``needs_values = True`` on its parameter class (a step term then supplies them,
``config.step_terms``: a value model) and sets ``fn.returns = targets`` with
``targets(inputs, params) -> Tensor [N, L]``: the value targets the values are trained towards.

A group-relative estimator declares ``group_baseline`` (True on its parameter instance) when
each sample is baselined by the other samples of its prompt group: validation refuses it with
``rollout.n_samples_per_prompt=1``, where every advantage would be 0.

Metric tensors in outputs are reduced by the objective: an [N, L] tensor becomes its mean
over the loss-masked tokens of the mini-batch, an [N] tensor its mean over the valid
sequences. Names carry their section (``train/pg_clipfrac``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AdvantageInputs:
    """What an advantage estimator sees: the whole step's samples.

    ``token_rewards`` holds −β·KL_t on loss tokens when the KL is used as a reward
    penalty (else 0), plus the outcome reward at each row's last loss token;
    ``rewards`` is its row sum (the outcome reward, KL penalty included). ``values`` are the
    per-token baseline V of the state before each token, when the estimator reads one.
    """

    rewards: torch.Tensor  # [N] float
    token_rewards: torch.Tensor  # [N, L] float
    group_ids: torch.Tensor  # [N] long: samples of one prompt share an id
    mask: torch.Tensor  # [N, L] float loss mask
    values: torch.Tensor | None = None  # [N, L] float (estimators with needs_values)


@dataclass
class PolicyLossInputs:
    """One micro-batch as a policy loss or an IS correction sees it (all [N, L])."""

    logprobs: torch.Tensor  # log π_θ, requires grad
    old_logprobs: torch.Tensor  # log π_old (trainer recompute at step start)
    rollout_logprobs: torch.Tensor  # log π_roll (inference engine)
    advantages: torch.Tensor  # Â per token
    mask: torch.Tensor  # loss mask, float
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # batch extras (prepare outputs)


@dataclass
class PolicyLossOutput:
    """Per-token loss ℓ [N, L] (minimised), an optional keep mask, and metric tensors.

    ``keep`` (0/1, [N, L]) removes tokens from the numerator of the aggregated loss; the
    denominators keep counting the loss mask.
    """

    loss: torch.Tensor
    keep: torch.Tensor | None = None
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class Correction:
    """A detached per-token weight multiplying the policy loss, and/or a keep mask."""

    weight: torch.Tensor | None = None  # [N, L], no grad
    keep: torch.Tensor | None = None  # [N, L] 0/1
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
