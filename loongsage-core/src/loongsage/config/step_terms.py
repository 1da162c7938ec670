"""The training-step seam, config side: step term plugins, the sections they own, their validation.

The RL step (``loongsage.controller.train_step.TrainStep``) has one extension point: a *step
term*, a plugin of kind ``step_term`` (hook ``loongsage_register_step_terms``) for whatever
adds inputs to a batch, shapes advantages, adds a loss, or needs actors of its own. On-policy
distillation (loongsage-distill's ``opd``: teachers, a GKD loss, an advantage penalty) is one.
A registered step term is an object (an instance; ``validate`` is called on it) that declares:

- ``section``: the root config section it owns, typed by the dataclass ``schema`` (its field
  comments are the keys' descriptions in ``loongsage config show --doc``), and
  ``source_schema``: a dataclass of keys it adds to every data source (None: none). Both join
  the root schema when the plugin is installed (``config.store.root_schema``), so the keys
  users write are checked like core's;
- ``validate(cfg, registries) -> settings | None``: its settings, validated, with every error
  a ``ConfigError`` naming its key; None when the run does not use it (a section left at its
  defaults). At most one step term is active in a run;
- ``memory(cfg, settings, batch_tokens) -> Sequence[MemoryShare]``: what its actors and its
  share of each train actor hold, for the start-up memory estimate
  (``controller.memory_budget``); ``batch_tokens`` counts the positions of a step's batch;
- ``build(context) -> StepExtension`` (``StepContext``): started once per run, after the
  train ranks; it may start actors of its own through ``context.spawn`` (seated beside train
  rank 0). The extension writes each training batch's inputs into ``TrainBatch.extras``
  (``before_train(batch, row_sources) -> metrics``), hands the train-side ``train_term``
  (``loongsage.algorithms.step_term.StepTerm``) that rides in the objective into the train
  actor, lists the ``actors`` it started (role -> handle: memory reports, failures), and
  ``close()``s them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from loongsage.errors import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from loongsage.algorithms.step_term import StepTerm
    from loongsage.engines.batch import TrainBatch
    from loongsage.registry import Registries, RegistryEntry


@dataclass(frozen=True)
class MemoryShare:
    """Memory a step term adds to the start-up estimate: one part of its own (its actors),
    what it adds to each train actor, and the detail a warning prints for its part."""

    part: str
    bytes: int
    train_actor_bytes: int = 0
    detail: str = ""


@dataclass(frozen=True)
class StepContext:
    """What a step term's extension is built from (module docstring)."""

    settings: Any  # what its validate returned
    config: dict  # the run's resolved config, plain containers
    spawn: Callable[[Any, dict, str], Any]  # (engine PluginRef, engine config, role) -> actor handle


class StepExtension(Protocol):
    """A step term, started for one run (module docstring)."""

    train_term: StepTerm
    actors: dict[str, Any]

    def before_train(self, batch: TrainBatch, row_sources: Sequence[str]) -> dict[str, float]: ...

    def close(self) -> None: ...


class StepTermPlugin(Protocol):
    """Contract of kind ``step_term`` (module docstring)."""

    section: str
    schema: type
    source_schema: type | None

    def validate(self, cfg: DictConfig, registries: Registries) -> Any | None: ...

    def memory(self, cfg: DictConfig, settings: Any, batch_tokens: int) -> Sequence[MemoryShare]: ...

    def build(self, context: StepContext) -> StepExtension: ...


@dataclass(frozen=True)
class ActiveTerm:
    """The run's step term: its registry entry (no config node names it: its section is
    typed by its own schema, not by a plugin's parameters) and its validated settings."""

    plugin: RegistryEntry
    settings: Any

    def memory(self, cfg: DictConfig, batch_tokens: int) -> Sequence[MemoryShare]:
        return self.plugin.obj.memory(cfg, self.settings, batch_tokens)

    def build(self, context: StepContext) -> StepExtension:
        return self.plugin.obj.build(context)


def step_term_plugins(registries: Registries | None) -> list[Any]:
    """Every installed step term's registered object (none without registries)."""
    return [] if registries is None else [entry.obj for entry in registries["step_term"]]


def data_source_type(registries: Registries | None) -> type:
    """``DataSourceConfig`` plus the keys every installed step term adds to a data source."""
    from loongsage.schema import DataSourceConfig

    extra = tuple(p.source_schema for p in step_term_plugins(registries) if p.source_schema is not None)
    if not extra:
        return DataSourceConfig
    return dataclasses.make_dataclass("DataSourceConfig", [], bases=(*reversed(extra), DataSourceConfig))


def validate_step_terms(cfg: DictConfig, registries: Registries) -> ActiveTerm | None:
    """The run's step term, validated; None when no installed step term is used by ``cfg``."""
    active = []
    for entry in registries["step_term"]:
        settings = entry.obj.validate(cfg, registries)
        if settings is not None:
            active.append(ActiveTerm(entry, settings))
    if len(active) > 1:
        sections = [term.plugin.obj.section for term in active]
        raise ConfigError(sections[1], f"sections {sections} each extend the training step; one step term "
                                       "per run is supported: leave all but one at their defaults")
    return active[0] if active else None
