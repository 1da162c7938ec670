"""The training-step seam, config side: step term plugins, the sections they own, their validation.

The RL step (``loongsage.controller.train_step.TrainStep``) has one extension point: a *step
term*, a plugin of kind ``step_term`` (hook ``loongsage_register_step_terms``) for whatever
adds inputs to a batch, shapes advantages, adds a loss, trains a model of its own beside the
policy, or needs actors of its own. On-policy distillation (loongsage-distill's ``opd``:
teachers, a GKD loss, an advantage penalty) is one; the value model of a values-based
advantage estimator (loongsage-algos' ``algorithm.critic``: per-token values before the
step, its own training after it) is another. A registered step term is an object (an
instance; ``validate`` is called on it) that declares:

- ``section``: the config section it owns, typed by the dataclass ``schema`` (its field
  comments are the keys' descriptions in ``loongsage config show --doc``): a root section
  (``opd``) or one level inside a core section (``algorithm.critic``: a field of that
  section's dataclass), and ``source_schema``: a dataclass of keys it adds to every data
  source (None: none). Both join the root schema when the plugin is installed
  (``config.store.root_schema``), so the keys users write are checked like core's;
- ``validate(cfg, registries) -> settings | None``: its settings, validated, with every error
  a ``ConfigError`` naming its key; None when the run does not use it (a section left at its
  defaults). Several step terms may be active in one run, but at most one of them carries a
  train-side term (``has_train_term``, optional, default True);
- ``supplies`` (optional, default none): the ``TrainBatch.extras`` keys its extension writes
  that core reads. ``values`` is the one core reads: the per-token baseline [N, L] of an
  advantage estimator whose parameters declare ``needs_values`` (``gae``); validation refuses
  such an estimator when no active step term supplies ``values``;
- ``memory(cfg, settings, batch_tokens) -> Sequence[MemoryShare]``: what its actors and its
  share of each train actor hold, for the start-up memory estimate
  (``controller.memory_budget``); ``batch_tokens`` counts the positions of a step's batch;
- ``build(context) -> StepExtension`` (``StepContext``): started once per RL run (with
  rollout engines or a recording; not for ``loongsage sft``), right after the train ranks;
  it may start actors of its own through ``context.spawn`` (seated beside train rank 0).
  The extension writes each training batch's inputs into ``TrainBatch.extras``
  (``before_train(batch, row_sources) -> metrics``), hands the train-side ``train_term``
  (``loongsage.algorithms.step_term.StepTerm``, or None) that rides in the objective into the
  train actor, lists the ``actors`` it started (role -> handle: memory reports, failures), and
  ``close()``s them. Optional hooks, each called when the extension defines it
  (``controller.step_extension.StepExtensions``):

  - ``policy_trains(step) -> bool``: False skips the policy's update of ``step`` (a warm-up
    of the term's own model); the term's other hooks still run;
  - ``after_train(batch, rewards, group_index) -> metrics``: after the policy's update (or
    its skip), e.g. to train the term's own model on the step's batch;
  - ``save_state(folder)`` / ``load_state(folder)``: its state into and out of a checkpoint
    folder (and the step snapshot, which saves as a checkpoint does), in a subfolder of its
    own next to ``trainer/``;
  - ``warm_started(policy)``: the supervised warm start ended; ``policy()`` saves the
    warm-started policy as a Hugging Face folder (once per run, only when asked) and returns
    its path (a model of its own may start from it);
  - ``onload()`` / ``offload()``: colocated phases move its device state with the train
    ranks' (``controller.phases``);
  - ``sample_fields``: ``TrainBatch.extras`` keys [N, L] it wrote whose rows the run
    directory keeps per token with the saved samples (a ``Sample`` field of that name,
    ``controller.batching.attach_rows``).
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
    algorithm: Any = None  # the run's resolved algorithm section (its advantage estimator with parameters)


class StepExtension(Protocol):
    """A step term, started for one run (module docstring; the optional hooks are listed there)."""

    train_term: StepTerm | None
    actors: dict[str, Any]

    def before_train(self, batch: TrainBatch, row_sources: Sequence[str]) -> dict[str, float]: ...

    def close(self) -> None: ...


class StepTermPlugin(Protocol):
    """Contract of kind ``step_term`` (module docstring; ``has_train_term`` and ``supplies``
    are optional)."""

    section: str
    schema: type
    source_schema: type | None

    def validate(self, cfg: DictConfig, registries: Registries) -> Any | None: ...

    def memory(self, cfg: DictConfig, settings: Any, batch_tokens: int) -> Sequence[MemoryShare]: ...

    def build(self, context: StepContext) -> StepExtension: ...


@dataclass(frozen=True)
class ActiveTerm:
    """A step term of the run: its registry entry (no config node names it: its section is
    typed by its own schema, not by a plugin's parameters) and its validated settings."""

    plugin: RegistryEntry
    settings: Any

    @property
    def section(self) -> str:
        return self.plugin.obj.section

    @property
    def has_train_term(self) -> bool:
        return bool(getattr(self.plugin.obj, "has_train_term", True))

    @property
    def supplies(self) -> tuple[str, ...]:
        return tuple(getattr(self.plugin.obj, "supplies", ()))

    def memory(self, cfg: DictConfig, batch_tokens: int) -> Sequence[MemoryShare]:
        return self.plugin.obj.memory(cfg, self.settings, batch_tokens)

    def build(self, context: StepContext) -> StepExtension:
        return self.plugin.obj.build(context)


def step_term_plugins(registries: Registries | None) -> list[Any]:
    """Every installed step term's registered object (none without registries)."""
    return [] if registries is None else [entry.obj for entry in registries["step_term"]]


def section_types(registries: Registries | None) -> dict[str, type]:
    """Core's sections (``loongsage.schema.SECTIONS``) with every installed step term's section:
    a root one by its name, a nested one (``algorithm.critic``) as a field added to the
    dataclass of the core section it sits in."""
    from loongsage.schema import SECTIONS

    types = dict(SECTIONS)
    nested: dict[str, list[tuple[str, type]]] = {}
    for plugin in step_term_plugins(registries):
        parent, dot, name = plugin.section.rpartition(".")
        if dot:
            nested.setdefault(parent, []).append((name, plugin.schema))
        else:
            types[name] = plugin.schema
    for parent, fields in nested.items():
        base = types[parent]
        types[parent] = dataclasses.make_dataclass(
            base.__name__, [(name, schema, dataclasses.field(default_factory=schema)) for name, schema in fields],
            bases=(base,))
    return types


def data_source_type(registries: Registries | None) -> type:
    """``DataSourceConfig`` plus the keys every installed step term adds to a data source."""
    from loongsage.schema import DataSourceConfig

    extra = tuple(p.source_schema for p in step_term_plugins(registries) if p.source_schema is not None)
    if not extra:
        return DataSourceConfig
    return dataclasses.make_dataclass("DataSourceConfig", [], bases=(*reversed(extra), DataSourceConfig))


def validate_step_terms(cfg: DictConfig, registries: Registries) -> tuple[ActiveTerm, ...]:
    """The run's step terms, validated: those of the installed ones that ``cfg`` uses."""
    active = []
    for entry in registries["step_term"]:
        settings = entry.obj.validate(cfg, registries)
        if settings is not None:
            active.append(ActiveTerm(entry, settings))
    training = [term.section for term in active if term.has_train_term]
    if len(training) > 1:
        raise ConfigError(training[1], f"sections {training} each add a term to the training step's loss; "
                                       "one such step term per run is supported: leave all but one at their "
                                       "defaults")
    return tuple(active)
