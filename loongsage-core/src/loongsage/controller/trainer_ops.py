"""Functions shipped into the train-engine actor, so tensors never leave its process."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from loongsage.engines.batch import TrainBatch


def train_on_rollout(
    engine: Any,
    batch: TrainBatch,
    loss_fn: Callable[..., Any],
    mini_batches: int,
    need_ref: bool,
) -> dict[str, float]:
    """pi_old logprobs (and reference logprobs) at step start, then the optimizer steps."""
    batch.extras["old_logprobs"] = engine.compute_logprobs(batch)["logprobs"]
    if need_ref:
        batch.extras["ref_logprobs"] = engine.compute_ref_logprobs(batch)
    return engine.train_step(batch, loss_fn, mini_batches=mini_batches)


def apply_numpy_state(engine: Any, state: dict[str, np.ndarray], version: int) -> int:
    """Load a weight snapshot into a rollout engine (object-store path)."""
    engine.apply_weights(((name, torch.from_numpy(array)) for name, array in state.items()), version)
    return version
