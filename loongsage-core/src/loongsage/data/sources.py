"""Data sources: each ``data_sources[i]`` entry built from the plugins it names, resolved once.

Config validation turns every entry into a ``SourceSpec``: its settings plus every plugin it
names resolved once (dataset, agent, reward, sandbox, filters: ``loongsage.registry.PluginRef``s
with typed parameters); this module builds them and nothing here looks a name up again. A ``DataSource`` bundles the
built dataset (``cls(params, seed)``), the reward (``reward(text, ground_truth, params,
**context)``), the agent (``cls(params, context)``), the source's sandbox, filters and
per-source sampling overrides.

The source's sandbox (``data_sources[i].sandbox``) is the one its agent and its reward get:
both receive it in their ``SourceContext`` / reward context as a ``SandboxFactory``, so a
sandbox backend from a config-local ``plugins:`` module is as reachable as a built-in one.

``DataSource.get(index)`` is what the mixer reads: the dataset's prompt, stamped with the
source's name and index, with the source's ``system_prompt`` (when set) as the first
message, replacing a system message the dataset supplied.

``RewardCall`` is the one scoring function: the reward bound to the source's sandbox,
picklable, so a run scores in worker processes under the reward's deadline
(``loongsage.data.scoring``) and ``DataSource.score`` runs the same call in-process. Reading
the dataset runs in-process within the time budgets of the ``budgets`` section: building it
(``dataset_load_s``) and each ``get`` (``dataset_get_s``); a stalled reader stops the run
with an error naming it (``loongsage.deadline.budget``).

A source that names an environment (``data_sources[i].environment``) has its dataset, agent and
reward bound to it at validation (``loongsage.data.environments``): ``build_source`` builds the
environment once, reads the tasks of its split (``held_out`` for an ``eval_only`` source) as the
dataset, and lends the environment to its episode agent (``SourceContext.environment``).

A source marked ``eval_only`` (held-out tasks) is built like any other, with its agent, router
and reward, but only evaluations read it: ``training_sources`` is what the mixer and the SFT
warm start get, ``evaluation_sources`` what ``trainer.eval_*`` draws from.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from loongsage.data.types import Prompt
from loongsage.deadline.budget import UNLIMITED, Budget
from loongsage.errors import ConfigError
from loongsage.registry import PluginRef, Registries


@dataclass(frozen=True)
class SourceSpec:
    """One validated ``data_sources[i]`` entry: its settings and its plugins, resolved."""

    index: int
    name: str
    weight: float
    dataset: PluginRef
    agent: PluginRef
    reward: PluginRef
    sandbox: PluginRef | None = None
    environment: PluginRef | None = None  # the source's environment; dataset, agent, reward bound to it
    filters: tuple[PluginRef, ...] = ()
    sampling: Mapping[str, Any] = field(default_factory=dict)
    system_prompt: str | None = None
    eval_only: bool = False  # scored by evaluations only, never trained on
    load_budget: Budget = UNLIMITED  # building the dataset (budgets.dataset_load_s)
    get_budget: Budget = UNLIMITED  # one dataset.get (budgets.dataset_get_s)

    @property
    def key(self) -> str:
        return f"data_sources[{self.index}]"

    @property
    def tasks(self) -> PluginRef:
        """What supplies the prompts: the environment when the source names one, else its dataset."""
        return self.environment or self.dataset


@dataclass(frozen=True)
class SandboxFactory:
    """Builds (unstarted) sandboxes of a source's ``sandbox`` backend with its parameters.

    Use as ``async with factory(files={...}) as sandbox``; picklable, so it reaches reward
    worker processes.
    """

    ref: PluginRef

    def __call__(self, *, files: Mapping[str, bytes | str] | None = None, untrusted: bool = True) -> Any:
        return self.ref.obj(self.ref.params, files=files, untrusted=untrusted, key=self.ref.key)


@dataclass(frozen=True)
class RewardCall:
    """A source's reward bound to the source's sandbox: the one scoring function.

    ``call(text, ground_truth, **context)`` runs ``reward(text, ground_truth, params,
    **context, sandbox=...)`` and returns its result as a dict with a float ``score`` (a bare
    number becomes ``{"score": x}``). A score that is not finite (NaN, inf) raises ``ValueError``:
    it is a failed reward call, counted and handled by ``reward.on_error``, rather than a NaN
    that would reach the loss and end the run naming no reward. Picklable (a ``PluginRef`` and a ``SandboxFactory``), so
    it is what a reward worker process runs (``loongsage.data.scoring``).
    """

    reward: PluginRef
    sandbox: SandboxFactory | None
    source: str

    def __call__(self, text: str, ground_truth: Any, **context: Any) -> dict[str, Any]:
        result = self.reward.obj(text, ground_truth, self.reward.params, **context, sandbox=self.sandbox)
        if isinstance(result, Mapping):
            if "score" not in result:
                raise ValueError(f"reward of source {self.source!r} returned a dict without 'score': "
                                 f"{result!r}")
            return {**result, "score": self._finite(result["score"])}
        return {"score": self._finite(result)}

    def _finite(self, score: Any) -> float:
        value = float(score)
        if not math.isfinite(value):
            raise ValueError(f"reward of source {self.source!r} returned a non-finite score: {value}")
        return value


@dataclass(frozen=True)
class SourceContext:
    """What a data source lends the agent it builds: tokenizer, sandbox, registries, its key."""

    source: str
    key: str  # "data_sources[i]", for errors
    tokenizer: Any
    registries: Registries
    sandbox: SandboxFactory | None = None
    environment: Any = None  # the built environment of an environment source (its episode agent runs it)

    def require_sandbox(self, who: str) -> SandboxFactory:
        """The source's sandbox, or a ``ConfigError`` saying ``who`` needs one."""
        if self.sandbox is None:
            raise ConfigError(f"{self.key}.sandbox", f"{who} runs commands in a sandbox: name one, "
                              "e.g. sandbox: {type: bwrap}")
        return self.sandbox


@dataclass
class DataSource:
    """One data source, built: prompts, scoring, agent loop and sampling overrides."""

    spec: SourceSpec
    dataset: Any  # has get(index) -> Prompt, and __len__ unless infinite
    agent: Any = None  # built agent; None when built without a tokenizer
    sandbox: SandboxFactory | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def weight(self) -> float:
        return self.spec.weight

    @property
    def system_prompt(self) -> str | None:
        return self.spec.system_prompt

    @property
    def sampling(self) -> dict[str, Any]:
        return dict(self.spec.sampling)

    @property
    def reward_call(self) -> RewardCall:
        """The source's reward with its sandbox, ready to run here or in a worker process."""
        return RewardCall(self.spec.reward, self.sandbox, self.name)

    def size(self) -> int | None:
        """Number of prompts in one epoch, or ``None`` for an infinite dataset."""
        return len(self.dataset) if hasattr(self.dataset, "__len__") else None

    def get(self, index: int) -> Prompt:
        """Prompt ``index`` of the dataset, stamped with this source (within ``spec.get_budget``)."""
        return self._stamped(self.spec.get_budget.run(self._get_call(index), self.dataset.get, index), index)

    def get_each(self, indexes: Sequence[int]) -> list[Prompt | Exception]:
        """``get`` of every index, read on one thread (``Budget.run_each``), each read within the
        same budget; a record's error is returned in its place."""
        read = self.spec.get_budget.run_each(self._get_call, self.dataset.get, indexes)
        return [r if isinstance(r, Exception) else self._stamped(r, i) for r, i in zip(read, indexes)]

    def _get_call(self, index: int) -> str:
        tasks = self.spec.tasks
        return f"{tasks.key}: {tasks.kind} '{tasks.name}' get({index})"

    def _stamped(self, prompt: Prompt, index: int) -> Prompt:
        messages = list(prompt.messages)
        if self.system_prompt:
            if messages and messages[0].get("role") == "system":
                messages = messages[1:]
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        return dataclasses.replace(prompt, source=self.name, index=index, messages=messages)

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools this source's agent offers the model (``[]`` for agents without tools)."""
        offered = getattr(self.agent, "tool_schemas", None)
        return list(offered()) if offered is not None else []

    def score(self, text: str, ground_truth: Any, **context: Any) -> dict[str, Any]:
        """The reward's result for one response, computed here (``RewardCall``)."""
        return self.reward_call(text, ground_truth, **context)


def check_reward(call: RewardCall) -> None:
    """A ``ConfigError`` now, rather than on every sample, if the reward cannot be called or
    cannot travel to a reward worker process."""
    ref = call.reward
    if not callable(ref.obj):
        raise ConfigError(ref.key, f"reward '{ref.name}' of '{ref.entry.distribution}' is a "
                          f"{type(ref.obj).__name__}, not a callable")
    try:
        pickle.dumps(call)
    except Exception as err:  # noqa: BLE001 - any pickling failure: say what to change
        raise ConfigError(ref.key, f"reward '{ref.name}' of '{ref.entry.distribution}' cannot be sent "
                          f"to a reward worker process ({type(err).__name__}: {err}); register a "
                          "module-level function or class and picklable parameters") from None


def _load_environment(spec: SourceSpec, seed: int, sandbox: SandboxFactory | None) -> tuple[Any, Any]:
    """An environment source's environment and the tasks of its split (``data.environments``)."""
    from loongsage.data.environments import EnvironmentContext, build_environment, environment_tasks

    env = spec.environment
    environment = build_environment(env, EnvironmentContext(spec.name, env.key, seed, sandbox))
    return environment, environment_tasks(environment, spec.dataset.params.split)


def build_source(spec: SourceSpec, registries: Registries, seed: int = 0, tokenizer: Any = None) -> DataSource:
    """Build one data source from its ``spec`` (the agent only when a ``tokenizer`` is given)."""
    sandbox = SandboxFactory(spec.sandbox) if spec.sandbox is not None else None
    environment = None
    what = f"{spec.tasks.key}: {spec.tasks.kind} '{spec.tasks.name}' building its prompts"
    try:
        if spec.environment is None:
            dataset = spec.load_budget.run(what, spec.dataset.obj, spec.dataset.params, seed)
        else:
            environment, dataset = spec.load_budget.run(what, _load_environment, spec, seed, sandbox)
    except ConfigError as err:  # the dataset names its own field (an environment: within its node)
        prefix = spec.key if spec.environment is None else spec.environment.key
        raise ConfigError(f"{prefix}.{err.key}", err.problem) from None
    except (OSError, ValueError) as err:  # missing file, bad record: the message names them
        raise ConfigError(spec.tasks.key, str(err)) from err
    check_reward(RewardCall(spec.reward, sandbox, spec.name))
    agent = None
    if tokenizer is not None:
        context = SourceContext(spec.name, spec.key, tokenizer, registries, sandbox, environment)
        agent = spec.agent.obj(spec.agent.params, context)
    return DataSource(spec, dataset, agent, sandbox)


def build_sources(specs: tuple[SourceSpec, ...], registries: Registries, seed: int = 0,
                  tokenizer: Any = None) -> dict[str, DataSource]:
    """Build every data source, keyed by name, in config order."""
    return {spec.name: build_source(spec, registries, seed, tokenizer) for spec in specs}


def training_sources(sources: Mapping[str, DataSource]) -> dict[str, DataSource]:
    """The sources batches and the SFT warm start draw from: all but the ``eval_only`` ones."""
    return {name: s for name, s in sources.items() if not s.spec.eval_only}


def evaluation_sources(sources: Mapping[str, DataSource]) -> dict[str, DataSource]:
    """The sources evaluations draw from: the ``eval_only`` ones if any, else the training ones."""
    held_out = {name: s for name, s in sources.items() if s.spec.eval_only}
    return held_out or training_sources(sources)
