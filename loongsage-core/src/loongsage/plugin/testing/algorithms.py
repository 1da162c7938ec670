"""Checks and helpers for testing algorithm plugins (ours and third-party ones).

``loss_context`` builds the ``LossContext`` a train engine would hand the objective for one
micro-batch; ``split_and_sum`` runs a loss closure over row-slices of a batch with global
denominators, which is how engines call it. ``check_policy_loss_contract``,
``check_correction_contract``, ``check_advantage_contract`` and ``check_kl_policy_contract``
assert the properties every entry of those kinds must have (shapes, finite values, where the
gradient flows, metrics [N, L] or [N]) on random inputs, raising ``AssertionError``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from loongsage.algorithms.types import PolicyLossInputs, PolicyLossOutput
from loongsage.engines.batch import LossContext, TrainBatch


def loss_context(
    logprobs: torch.Tensor,
    mask: torch.Tensor,
    extras: dict[str, torch.Tensor],
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
) -> LossContext:
    """A ``LossContext`` for rows [N, L]; denominators default to this batch's own counts."""
    n, length = mask.shape
    batch = TrainBatch(
        input_ids=torch.zeros(n, length, dtype=torch.long),
        attention_mask=torch.ones(n, length, dtype=torch.long),
        loss_mask=mask,
        extras=dict(extras),
    )
    tokens = float(mask.sum()) if global_num_tokens is None else global_num_tokens
    seqs = float((mask.sum(-1) > 0).sum()) if global_num_seqs is None else global_num_seqs
    return LossContext(batch, logprobs, None, tokens, seqs)


def split_and_sum(
    loss_fn: Callable[[LossContext], tuple[torch.Tensor, dict[str, float]]],
    logprobs: torch.Tensor,
    mask: torch.Tensor,
    extras: dict[str, torch.Tensor],
    bounds: Sequence[int],
) -> tuple[torch.Tensor, dict[str, float]]:
    """Call ``loss_fn`` on rows [bounds[k], bounds[k+1]) and sum losses and metrics."""
    tokens, seqs = float(mask.sum()), float((mask.sum(-1) > 0).sum())
    total: torch.Tensor | float = 0.0
    metrics: dict[str, float] = {}
    for a, b in zip(bounds, bounds[1:]):
        ctx = loss_context(logprobs[a:b], mask[a:b], {k: v[a:b] for k, v in extras.items()}, tokens, seqs)
        loss, part = loss_fn(ctx)
        total = total + loss
        for key, value in part.items():
            metrics[key] = metrics.get(key, 0.0) + value
    return total, metrics  # type: ignore[return-value]


def check_policy_loss_contract(fn: Callable[..., PolicyLossOutput], params: Any, seed: int = 0) -> None:
    """Assert the policy-loss contract on a random batch; raises AssertionError if broken."""
    g = torch.Generator().manual_seed(seed)
    n, length = 4, 6
    mask = (torch.rand(n, length, generator=g) > 0.3).float()
    mask[:, 0] = 1.0
    logprobs = (-torch.rand(n, length, generator=g) * 2).requires_grad_()
    old = logprobs.detach() + 0.05 * torch.randn(n, length, generator=g)
    roll = old + 0.05 * torch.randn(n, length, generator=g)
    adv = torch.randn(n, 1, generator=g).expand(n, length) * mask
    inputs = PolicyLossInputs(logprobs, old, roll, adv, mask)
    out = fn(inputs, params)
    assert isinstance(out, PolicyLossOutput), f"{fn} must return PolicyLossOutput"
    assert out.loss.shape == (n, length), f"loss shape {tuple(out.loss.shape)} != {(n, length)}"
    assert torch.isfinite(out.loss[mask > 0]).all(), "loss must be finite on loss tokens"
    assert out.keep is None or out.keep.shape == (n, length), "keep must be [N, L]"
    for name, value in out.metrics.items():
        assert "/" in name, f"metric {name!r} needs a section prefix (train/...)"
        assert value.shape in ((n, length), (n,)), f"metric {name} has shape {tuple(value.shape)}"
    assert out.loss.requires_grad, "loss carries no gradient: the gradient must reach logprobs"
    (out.loss * mask).sum().backward()
    assert logprobs.grad is not None and torch.isfinite(logprobs.grad).all(), "gradient must reach logprobs"


def check_correction_contract(fn: Callable[..., Any], params: Any, seed: int = 0) -> None:
    """Assert the is_correction contract: [N, L] outputs without gradient, identity on policy.

    When π_θ, π_old and π_roll coincide, every correction must leave the loss unchanged:
    weights 1 (or None) and nothing masked.
    """
    from loongsage.algorithms.types import Correction

    g = torch.Generator().manual_seed(seed)
    n, length = 4, 6
    mask = (torch.rand(n, length, generator=g) > 0.3).float()
    old = -torch.rand(n, length, generator=g) * 2
    adv = torch.randn(n, 1, generator=g).expand(n, length) * mask
    for roll in (old + 0.2 * torch.randn(n, length, generator=g), old.clone()):
        logprobs = old.clone().requires_grad_()
        out = fn(PolicyLossInputs(logprobs, old, roll, adv, mask), params)
        assert isinstance(out, Correction), f"{fn} must return Correction"
        for name in ("weight", "keep"):
            value = getattr(out, name)
            assert value is None or value.shape == (n, length), f"{name} must be [N, L]"
            assert value is None or not value.requires_grad, f"{name} must carry no gradient"
    assert out.weight is None or torch.allclose(out.weight[mask > 0], torch.ones(())), "on policy: weight 1"
    assert out.keep is None or bool((out.keep[mask > 0] == 1).all()), "on policy: nothing masked"


def check_advantage_contract(fn: Callable[..., torch.Tensor], params: Any, seed: int = 0) -> None:
    """Assert the advantage contract: [N, L], finite, zero outside the loss mask, no gradient.
    An estimator with ``needs_values`` gets random per-token values [N, L]."""
    from loongsage.algorithms.advantages import build_inputs

    g = torch.Generator().manual_seed(seed)
    n, length = 8, 5
    mask = (torch.rand(n, length, generator=g) > 0.3).float()
    mask[:, 0] = 1.0
    rewards = torch.rand(n, generator=g)
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2])
    inputs = build_inputs(rewards, groups, mask)
    if getattr(params, "needs_values", False):
        inputs.values = torch.randn(n, length, generator=g)
    out = fn(inputs, params)
    assert out.shape == (n, length), f"advantages must be [N, L], got {tuple(out.shape)}"
    assert torch.isfinite(out).all() and not out.requires_grad
    assert bool((out[mask == 0] == 0).all()), "advantages must be zero outside the loss mask"


def check_kl_policy_contract(fn: Callable[..., torch.Tensor], kl_targets: str = "logprobs") -> None:
    """Assert the kl_policy contract: zero on identical policies, with a gradient.

    ``kl_targets`` is the policy's own declaration (its parameter class's attribute):
    ``"logprobs"`` for a token-level ``fn(logprobs, ref_logprobs) -> [N, L]``; ``"full"`` or
    ``"topk"`` for a logit-level ``fn(logits [c, V], target_logprobs, target_ids, beta) -> [c]``,
    given the target's full log-softmax or its top-k (here k = V).
    """
    if kl_targets == "logprobs":
        logprobs = torch.tensor([[-1.0, -0.5, -3.0]], requires_grad=True)
        value = fn(logprobs, logprobs.detach().clone())
        assert value.shape == (1, 3), f"a token-level KL must be [N, L], got {tuple(value.shape)}"
        assert torch.all(value == 0), "KL of identical policies must be 0"
    else:
        logits = torch.tensor([[2.0, 0.5, -1.0, 0.0], [0.0, 0.0, 1.0, -2.0]], requires_grad=True)
        logprobs = torch.log_softmax(logits.detach(), -1)
        top = logprobs.topk(4, dim=-1)
        target = (logprobs, None) if kl_targets == "full" else (top.values, top.indices)
        value = fn(logits, *target, 0.5)
        assert value.shape == (2,), f"a logit-level KL must be [c], got {tuple(value.shape)}"
        assert value.abs().max() < 1e-6, "KL of identical distributions must be 0"
    assert value.requires_grad, "the KL must keep its gradient"
