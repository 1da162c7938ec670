"""The critic of a run: its actor, and what the controller asks of it each step.

A critic-based estimator (``gae``; ``AlgorithmSpec.critic``) needs a value model. It is an
engine plugin (``algorithm.critic.backend``, core's ``embedded_critic``) in its own Ray actor
(``EngineHost``), seated beside train rank 0 in its placement bundle: it books no CPUs or GPUs
of its own and time-shares them, as the policy and the critic take turns within a step.

Per training step (``verbs.Run.train``):

1. ``values(batch)``: V of every token under the current critic, written into the batch
   (``extras["values"]``) before the policy's ranks compute advantages from it (GAE);
2. the policy trains (skipped during ``warmup_steps``: critic-only steps, slime's
   ``--num-critic-only-steps``);
3. ``train(...)``: in the critic's actor, the estimator's value targets (``fn.returns``: GAE's
   returns R = Â + V from the same values) and ``updates_per_step`` passes of the clipped value
   loss. Metrics: ``critic/value_loss``, ``critic/value_clipfrac``, ``critic/grad_norm`` (means
   over the passes), and, of the values the step used, ``critic/explained_variance``
   1 − Var(R − V)/Var(R), ``critic/value_mean``, ``critic/value_std`` (a critic that
   collapsed to one value has std 0) and ``critic/return_mean`` over loss tokens.

Colocated phases onload the critic with the train ranks and offload it with them; its state
is saved beside the trainer's in every checkpoint (``critic/``) and restored on resume.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ray
import torch

from loongsage.algorithms.advantages import advantage_inputs
from loongsage.algorithms.validate import AlgorithmSpec
from loongsage.controller.actors import spawn_engine
from loongsage.controller.placement import Placement, Seat
from loongsage.engines.batch import TrainBatch


CONSTANT_RETURNS_RTOL = 1e-5  # returns whose std is below this x max(1, |R|) are one value


def value_metrics(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Explained variance of ``returns`` by ``values``, and both means, over the loss tokens.

    Returns that are one value (every reward of the step equal, as when no sample earned
    any: with γ = λ = 1 every R_t is the outcome) leave nothing to explain, and the explained
    variance is reported as 0. The check is to float32 rounding, not exact: R = Â + V is
    computed in float32 from values that vary, so constant returns come out with a std near
    1e-8, and dividing by that variance read −1.5e14 in a tiny SAO run whose rewards were
    all 0.
    """
    keep = mask > 0
    v, r = values[keep].double(), returns[keep].double()
    if r.numel() < 2:
        return {}
    variance = r.var()
    constant = float(variance.sqrt()) <= CONSTANT_RETURNS_RTOL * max(1.0, float(r.abs().max()))
    explained = 0.0 if constant else 1.0 - float((r - v).var() / variance)
    return {"critic/explained_variance": explained, "critic/value_mean": float(v.mean()),
            "critic/value_std": float(v.std()), "critic/return_mean": float(r.mean())}


def train_critic(engine: Any, data: tuple[TrainBatch, torch.Tensor, torch.Tensor], spec: AlgorithmSpec,
                 mini_batches: int) -> dict[str, float]:
    """Inside the critic's actor: value targets of the batch, then ``updates_per_step`` passes."""
    batch, rewards, group_index = data
    values = batch.extras["values"]
    inputs = advantage_inputs(rewards, group_index, batch.loss_mask, spec, values=values)
    returns = spec.advantage.obj.returns(inputs, spec.advantage.params)
    metrics = value_metrics(values, returns, inputs.mask)
    passes = spec.critic.settings.updates_per_step
    totals: dict[str, float] = {}
    for _ in range(passes):
        for key, value in engine.train_values(batch, returns, values, mini_batches).items():
            totals[key] = totals.get(key, 0.0) + value / passes
    return {**metrics, **totals}


class Critic:
    """The critic's actor, addressed by the controller."""

    def __init__(self, actor: Any, spec: AlgorithmSpec, mini_batches: int) -> None:
        self.actor, self.spec, self.mini_batches = actor, spec, mini_batches

    @property
    def actors(self) -> dict[str, Any]:
        return {"critic": self.actor}

    def warming_up(self, step: int) -> bool:
        """True during the critic-only steps at the start of a run."""
        return step < self.spec.critic.settings.warmup_steps

    def values(self, batch: TrainBatch) -> torch.Tensor:
        return ray.get(self.actor.call.remote("compute_values", batch))

    def train(self, batch: TrainBatch, rewards: torch.Tensor, group_index: torch.Tensor) -> dict[str, float]:
        return ray.get(self.actor.run.remote(train_critic, (batch, rewards, group_index), self.spec,
                                             self.mini_batches))

    def call(self, method: str, *args: Any) -> Any:
        """``engine.method(*args)`` in the critic's actor (save, load, offload, onload)."""
        return ray.get(self.actor.call.remote(method, *args))

    def close(self) -> None:
        ray.kill(self.actor)


def build_critic(spec: AlgorithmSpec, plain: dict, train_seat: Seat, placement: Placement | None,
                 mini_batches: int) -> Critic:
    """The critic's actor in train rank 0's seat (its bundle, cores and threads, no booking)."""
    seat = dataclasses.replace(train_seat, role="critic", num_cpus=0, num_gpus=0)
    return Critic(spawn_engine(spec.critic.engine.obj, plain, seat, placement), spec, mini_batches)
