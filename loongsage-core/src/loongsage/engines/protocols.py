"""The train engine and the rollout engine as the controller calls them (``typing.Protocol``).

An engine plugin (kind ``engine``, ``docs/plugins.md``) is a class hosted in a Ray actor and
built by ``from_config(cfg, device=...)``; what else it has depends on its role. These two
protocols are those roles, written from the call sites in ``controller/`` (``train_step``,
``lifecycle``, ``phases``, ``build``): the built-in engines (``embedded_train`` and
``megatron``; ``embedded_rollout`` and ``sglang``) implement them without importing each
other, and a third-party engine implements the same ones. The third protocol, the weight
transport between them, is ``engines.weight_sync.WeightSync``, and the rollout engine class
opens it: ``RolloutEngine.weight_sync`` is how an engine says how its weights arrive.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Protocol, runtime_checkable

from loongsage.errors import ConfigError

if TYPE_CHECKING:  # the records are imported only for the annotations
    from pathlib import Path

    import numpy as np
    import torch

    from loongsage.engines.batch import TrainBatch
    from loongsage.engines.weight_sync import TrainRanks, WeightSync
    from loongsage.transfer import TransferConfig


@runtime_checkable
class TrainEngine(Protocol):
    """A train rank (``train.backend``): log-probs, optimizer steps, weights, checkpoints.

    Also: ``device`` (where it computes) and ``parallel``, its place among the data-parallel
    ranks (``engines.distributed.SingleProcess`` for one rank; ``full_tensors``,
    ``gather_rows``, ``local_rows``, ``rank``), which the weight syncs and the step use.
    Optional: ``join_process_group(...)`` (an engine that builds its own process groups, as
    Megatron's), ``keep_weights_in(place, owned)`` (colocated CPU runs keep the parameters in
    the weight-sync ring), ``reset_optimizer(lr)``, ``routed_experts(batch)``.
    """

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], device: str | None = None) -> TrainEngine: ...

    def compute_logprobs(self, batch: TrainBatch, with_entropy: bool = False, logit_term: Any = None,
                         with_routes: bool = False) -> dict[str, torch.Tensor]:
        """``{"logprobs": [N, L]}`` (+ ``"entropy"``, ``"logit_values"``, ``"routed_experts"``)
        at the loss-mask positions, without grad."""

    def compute_ref_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Log-probs ``[N, L]`` under the frozen reference (the checkpoint at ``model.path``)."""

    def train_step(self, batch: TrainBatch, loss_fn: Callable[..., Any], mini_batches: int = 1, *,
                   with_entropy: bool = False, logit_term: Any = None,
                   old_from_forward: bool = False) -> dict[str, float]:
        """``mini_batches`` optimizer steps on ``batch`` with the loss closure; averaged metrics."""

    def named_tensors(self, include_tied: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """``(hf_name, tensor)`` of the HF state dict: what a weight sync sends."""

    def state_numpy(self, include_tied: bool = False) -> dict[str, np.ndarray]:
        """The HF state dict as numpy arrays (the model export)."""

    def save(self, path: str | Path) -> Path:
        """A checkpoint of weights and optimizer state under ``path``."""

    def load(self, path: str | Path) -> None:
        """Restore what ``save`` wrote."""

    def offload(self) -> bool:
        """Colocated: leave the device to the rollout engines (False: nothing moved, e.g. CPU)."""

    def onload(self) -> bool:
        """Take the device back."""


@runtime_checkable
class RolloutEngine(Protocol):
    """A rollout replica (``rollout.backend``): an HTTP server speaking SGLang's API subset.

    ``start`` returns its URL; the engine pool, the router and the engine monitor talk to it
    over HTTP (``engines.client.EngineClient``). Optional: ``shares_process`` (class
    attribute: it may live in its colocated train rank's process), and whatever its own
    weight sync calls in its process (the TransferMesh sync calls ``apply_weights``).
    """

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], device: str | None = None) -> RolloutEngine: ...

    @classmethod
    def weight_sync(cls, cfg: Mapping[str, Any], trainers: TrainRanks, rollout_actors: list,
                    transfer: TransferConfig) -> WeightSync:
        """Open the run's weight transport from ``trainers`` to the started engines in
        ``rollout_actors`` (``cfg``: the run's resolved config, e.g. its placement mode)."""

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve; the URL."""

    @property
    def weight_version(self) -> int | str | None:
        """The version of the weights it serves."""

    def offload(self) -> bool:
        """Colocated: free the device for training (False: nothing moved)."""

    def onload(self) -> bool:
        """Take the device back before the weight sync."""


def check_rollout_engine(engine_cls: type, name: str) -> None:
    """Refuse a rollout engine class that cannot open a weight sync, before any actor starts
    (``name``: its ``rollout.backend``)."""
    if not callable(getattr(engine_cls, "weight_sync", None)):
        raise ConfigError("rollout.backend", (
            f"engine {name!r} ({engine_cls.__module__}.{engine_cls.__qualname__}) has no "
            "weight_sync(cfg, trainers, rollout_actors, transfer) classmethod, so its weights "
            "cannot be updated: a rollout engine implements loongsage.plugin.RolloutEngine "
            "(return loongsage.plugin.MeshWeightSync(...) for weights over TransferMesh)"))
