"""The critic of a run: its actor, and what the training step asks of it, as a step extension.

A values-based estimator (``gae``: its parameters declare ``needs_values``) needs a value
model. It is an engine plugin (``algorithm.critic.backend``: ``embedded_critic``, ``engine``)
in its own Ray actor (``EngineHost``), spawned through the step context beside train rank 0 in
its placement bundle: it books no CPUs or GPUs of its own and time-shares them, as the policy
and the critic take turns within a step.

Per training step, through the step extension's hooks (``loongsage.plugin.StepExtension``):

1. ``before_train``: V of every token under the current critic, written into the batch
   (``extras["values"]``, the estimator's per-token baseline) before the policy's ranks compute
   advantages from it (GAE); timed as ``timing/critic_values``;
2. ``policy_trains``: False during ``warmup_steps`` (critic-only steps, slime's
   ``--num-critic-only-steps``), so the policy waits;
3. ``after_train``: in the critic's actor, the estimator's value targets (``fn.returns``: GAE's
   returns R = Â + V from the same values) and ``updates_per_step`` passes of the clipped value
   loss, timed as ``timing/critic_train``. Metrics: ``critic/value_loss``,
   ``critic/value_clipfrac``, ``critic/grad_norm`` (means over the passes), and, of the values
   the step used, ``critic/explained_variance`` 1 − Var(R − V)/Var(R), ``critic/value_mean``,
   ``critic/value_std`` (a critic that collapsed to one value has std 0) and
   ``critic/return_mean`` over loss tokens.

``sample_fields`` keeps the values with the saved samples. Colocated phases onload the critic
with the train ranks and offload it with them (``onload``/``offload``); its state is saved
beside the trainer's in every checkpoint and step snapshot (``critic/``, ``save_state``) and
restored on resume (``load_state``); after a supervised warm start it takes the warm-started
policy's weights unless ``algorithm.critic.path`` is set (``warm_started``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import ray
import torch

from loongsage.plugin import TrainBatch, advantage_inputs

from loongsage_algos.critic.config import CriticSpec

FOLDER = "critic"  # the critic's subfolder of a checkpoint

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


def train_critic(engine: Any, data: tuple[TrainBatch, torch.Tensor, torch.Tensor], algorithm: Any,
                 updates: int, mini_batches: int) -> dict[str, float]:
    """Inside the critic's actor: value targets of the batch, then ``updates`` passes."""
    batch, rewards, group_index = data
    values = batch.extras["values"]
    inputs = advantage_inputs(rewards, group_index, batch.loss_mask, algorithm, values=values)
    returns = algorithm.advantage.obj.returns(inputs, algorithm.advantage.params)
    metrics = value_metrics(values, returns, inputs.mask)
    totals: dict[str, float] = {}
    for _ in range(updates):
        for key, value in engine.train_values(batch, returns, values, mini_batches).items():
            totals[key] = totals.get(key, 0.0) + value / updates
    return {**metrics, **totals}


class Critic:
    """The critic's actor, addressed by the training step's hooks (module docstring)."""

    sample_fields = ("values",)
    train_term = None  # the policy's loss is untouched: the critic acts through the values

    def __init__(self, context: Any) -> None:
        spec: CriticSpec = context.settings
        self.settings, self.algorithm = spec.settings, context.algorithm
        self.mini_batches = int(context.config["train"]["mini_batches_per_step"])
        self.actor = context.spawn(spec.engine, context.config, "critic")

    @property
    def actors(self) -> dict[str, Any]:
        return {"critic": self.actor}

    def call(self, method: str, *args: Any) -> Any:
        """``engine.method(*args)`` in the critic's actor."""
        return ray.get(self.actor.call.remote(method, *args))

    def before_train(self, batch: TrainBatch, row_sources: Any) -> dict[str, float]:
        start = time.perf_counter()
        batch.extras["values"] = self.call("compute_values", batch)
        return {"timing/critic_values": time.perf_counter() - start}

    def policy_trains(self, step: int) -> bool:
        """False during the critic-only steps at the start of a run."""
        return step >= self.settings.warmup_steps

    def after_train(self, batch: TrainBatch, rewards: torch.Tensor, group_index: torch.Tensor) -> dict[str, float]:
        start = time.perf_counter()
        metrics = ray.get(self.actor.run.remote(train_critic, (batch, rewards, group_index), self.algorithm,
                                                self.settings.updates_per_step, self.mini_batches))
        return {**metrics, "timing/critic_train": time.perf_counter() - start}

    def save_state(self, folder: Path) -> None:
        self.call("save", str(Path(folder) / FOLDER))

    def load_state(self, folder: Path) -> None:
        self.call("load", str(Path(folder) / FOLDER))

    def warm_started(self, policy: Callable[[], Path]) -> None:
        """The critic starts from the policy RL starts from, unless ``algorithm.critic.path`` is set."""
        if self.settings.path is None:
            self.call("load_body", str(policy()))

    def onload(self) -> None:
        self.call("onload")

    def offload(self) -> None:
        self.call("offload")

    def close(self) -> None:
        ray.kill(self.actor)
