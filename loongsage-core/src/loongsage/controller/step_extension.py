"""Starting the run's step terms (``config.step_terms``) on the controller side, and calling them.

Each step term's ``build`` gets a ``StepContext``: its validated settings, the run's config as
plain containers, the run's resolved algorithm section, and ``spawn``, which starts an engine
plugin in a Ray actor (``EngineHost``) placed beside train rank 0, in its placement bundle.
Such actors (a distiller's teachers, a value model) compute while the trainer waits for them,
so they share its cores, threads and CPU booking, and book no CPUs or GPUs of their own.

``StepExtensions`` is what the controller talks to: the run's started extensions, in
registration order, each hook called on every extension that defines it (the optional hooks
are listed in ``config.step_terms``). A run without step terms holds an empty one, so the
controller calls the same hooks either way.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from loongsage.config.step_terms import ActiveTerm, StepContext, StepExtension
from loongsage.controller.actors import spawn_engine
from loongsage.controller.placement import Placement, Seat
from loongsage.engines.batch import TrainBatch
from loongsage.registry import PluginRef


def start_step_extension(term: ActiveTerm, plain: dict, train_seat: Seat,
                         placement: Placement | None = None, algorithm: Any = None) -> StepExtension:
    """One step term, built; its actors sit in train rank 0's seat (``train_seat``, in its
    bundle of ``placement``) and time-share its cores (module docstring)."""

    def spawn(engine: PluginRef, cfg: dict, role: str) -> Any:
        seat = dataclasses.replace(train_seat, role=role, num_cpus=0, num_gpus=0)
        return spawn_engine(engine.obj, cfg, seat, placement)

    return term.build(StepContext(term.settings, plain, spawn, algorithm))


class StepExtensions:
    """The run's started step terms, addressed as one (module docstring)."""

    def __init__(self, extensions: Sequence[StepExtension] = ()) -> None:
        self.extensions = list(extensions)

    @classmethod
    def start(cls, terms: Sequence[ActiveTerm], plain: dict, train_seat: Seat,
              placement: Placement | None = None, algorithm: Any = None) -> "StepExtensions":
        started = cls()
        try:
            for term in terms:
                started.extensions.append(start_step_extension(term, plain, train_seat, placement, algorithm))
        except BaseException:
            started.close()
            raise
        return started

    def _having(self, hook: str) -> list[Any]:
        return [getattr(extension, hook) for extension in self.extensions if hasattr(extension, hook)]

    @property
    def train_term(self) -> Any:
        """The one train-side term among them (validation allows at most one), or None."""
        terms = [extension.train_term for extension in self.extensions
                 if getattr(extension, "train_term", None) is not None]
        return terms[0] if terms else None

    @property
    def actors(self) -> dict[str, Any]:
        return {role: actor for extension in self.extensions for role, actor in extension.actors.items()}

    @property
    def sample_fields(self) -> tuple[str, ...]:
        return tuple(name for fields in self._having("sample_fields") for name in fields)

    def _each(self, hook: str, *args: Any) -> None:
        for call in self._having(hook):
            call(*args)

    def _metrics(self, hook: str, *args: Any) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for call in self._having(hook):
            metrics.update(call(*args))
        return metrics

    def before_train(self, batch: TrainBatch, row_sources: Sequence[str]) -> dict[str, float]:
        return self._metrics("before_train", batch, row_sources)

    def policy_trains(self, step: int) -> bool:
        return all(call(step) for call in self._having("policy_trains"))

    def after_train(self, batch: TrainBatch, rewards: torch.Tensor, group_index: torch.Tensor) -> dict[str, float]:
        return self._metrics("after_train", batch, rewards, group_index)

    def save_state(self, folder: Path) -> None:
        self._each("save_state", folder)

    def load_state(self, folder: Path) -> None:
        self._each("load_state", folder)

    def warm_started(self, save_policy: Callable[[], Path]) -> None:
        """The supervised warm start ended; ``save_policy()`` saves the policy (once, when a
        hook asks for it) and returns its Hugging Face folder."""
        saved: list[Path] = []

        def policy() -> Path:
            if not saved:
                saved.append(save_policy())
            return saved[0]

        self._each("warm_started", policy)

    def onload(self) -> None:
        self._each("onload")

    def offload(self) -> None:
        self._each("offload")

    def close(self) -> None:
        for extension in self.extensions:
            extension.close()
