"""Starting the run's step term (``config.step_terms``) on the controller side.

The step term's ``build`` gets a ``StepContext``: its validated settings, the run's config as
plain containers, and ``spawn``, which starts an engine plugin in a Ray actor (``EngineHost``)
placed beside train rank 0, in its placement bundle. Such actors (a distiller's teachers)
compute while the trainer waits for them, so they share its cores, threads and CPU booking,
and book no CPUs or GPUs of their own.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from loongsage.config.step_terms import ActiveTerm, StepContext, StepExtension
from loongsage.controller.actors import spawn_engine
from loongsage.controller.placement import Placement, Seat
from loongsage.registry import PluginRef


def start_step_extension(term: ActiveTerm, plain: dict, train_seat: Seat,
                         placement: Placement | None = None) -> StepExtension:
    """The run's step term, built; its actors sit in train rank 0's seat (``train_seat``, in its
    bundle of ``placement``) and time-share its cores (module docstring)."""

    def spawn(engine: PluginRef, cfg: dict, role: str) -> Any:
        seat = dataclasses.replace(train_seat, role=role, num_cpus=0, num_gpus=0)
        return spawn_engine(engine.obj, cfg, seat, placement)

    return term.build(StepContext(term.settings, plain, spawn))
