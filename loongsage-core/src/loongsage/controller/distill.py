"""The controller's side of on-policy distillation: building the run's distiller.

The distiller is a plugin (``opd.distiller``, kind ``distiller``; loongsage-distill ships
``multi_teacher``), resolved by config validation into ``DistillSpec.distiller``. It is built
as ``cls(context)`` with a ``DistillContext``: the validated spec, the run's config as plain
containers, and ``spawn``, which starts an engine plugin in a Ray actor (``EngineHost``)
placed beside train rank 0, in its placement bundle (teacher forwards run while the trainer
waits for them, so they share its cores, threads and CPU booking). A built distiller provides

- ``teacher_outputs(batch, row_sources) -> metrics``: the teachers' outputs for one training
  batch, written into ``batch.extras`` (``row_sources[i]`` names row ``i``'s data source);
- ``train_term``: the ``DistillTerm`` the objective carries into the train actor
  (``loongsage.algorithms.distill_term``);
- ``actors``: role -> actor handle of every actor it started (memory reports, failures);
- ``close()``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from loongsage.algorithms.distill_term import DistillTerm
from loongsage.config.opd import DistillSpec
from loongsage.controller.actors import spawn_engine
from loongsage.controller.placement import Placement, Seat
from loongsage.engines.batch import TrainBatch
from loongsage.registry import PluginRef


@dataclass(frozen=True)
class DistillContext:
    """What a distiller is built from (module docstring)."""

    spec: DistillSpec
    config: dict  # the run's resolved config, plain containers
    spawn: Callable[[PluginRef, dict, str], Any]  # (engine ref, engine config, role) -> actor handle


class Distiller(Protocol):
    train_term: DistillTerm
    actors: dict[str, Any]

    def teacher_outputs(self, batch: TrainBatch, row_sources: Sequence[str]) -> dict[str, float]: ...

    def close(self) -> None: ...


def build_distiller(spec: DistillSpec, plain: dict, train_seat: Seat,
                    placement: Placement | None = None) -> Distiller:
    """The run's distiller; its actors sit in train rank 0's seat (``train_seat``, in its
    bundle of ``placement``) and time-share its cores, booking no CPUs or GPUs of their own."""

    def spawn(engine: PluginRef, cfg: dict, role: str) -> Any:
        seat = dataclasses.replace(train_seat, role=role, num_cpus=0, num_gpus=0)
        return spawn_engine(engine.obj, cfg, seat, placement)

    return spec.distiller.obj(DistillContext(spec, plain, spawn))
