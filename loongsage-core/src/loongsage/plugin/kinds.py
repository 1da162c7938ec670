"""One contract type per plugin kind: what a registered object must be to plug in.

Most kinds are callables or classes with a few methods; each is a ``typing.Protocol`` here,
written from the call sites in core (``docs/plugins.md`` §4 describes each in prose). Three
kinds are subclasses of a core base class instead, which gives them working defaults:
``router_middleware`` (``RouterMiddleware``), ``window_policy`` (``WindowPolicy``) and
``tracker`` (``Tracker``). Two protocols live where core calls them and are re-exported by
``loongsage.plugin``: ``ToolParser`` and the step term's ``StepTermPlugin`` (with ``StepTerm``).

``KIND_CONTRACTS`` names the contract type of every kind, as a name of ``loongsage.plugin``
(resolved on first use, so this module imports neither torch nor the router); it comes from
the table of kinds (``loongsage.kind_table``).

How an object is built is part of the contract but not expressible in a ``Protocol``: each
protocol's docstring says it (``cls(params, context)`` for an agent, ``cls(params, seed)``
for a dataset, ...). Optional methods are named in the docstrings, not in the protocols, so
that an object without them still satisfies ``isinstance`` on a runtime-checkable protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence, runtime_checkable

from loongsage.kind_table import KIND_TABLE

if TYPE_CHECKING:  # the records are imported only for the annotations
    import torch

    from loongsage.algorithms.filters import FilterResult
    from loongsage.algorithms.types import AdvantageInputs, Correction, PolicyLossInputs, PolicyLossOutput
    from loongsage.data.environments import Endpoint, Episode
    from loongsage.data.types import Group, Prompt, Sample
    from loongsage.engines.replies import GenerateOutput
    from loongsage.registry import Registries


@runtime_checkable
class GenerationClient(Protocol):
    """What an agent gets as ``client``: the run's engine pool, balancing over every rollout engine.

    ``agenerate_batch`` sends several prompts in one request to one engine, one output per
    prompt in order, so a group's copies of its prompt share one prefill.
    """

    async def agenerate(self, input_ids: Sequence[int], sampling_params: dict[str, Any] | None = None, *,
                        return_logprob: bool = True, rid: str | None = None) -> GenerateOutput: ...

    async def agenerate_batch(self, prompts: Sequence[Sequence[int]], sampling_params: Any = None, *,
                              return_logprob: bool = True,
                              rids: Sequence[str] | None = None) -> list[GenerateOutput]: ...


@runtime_checkable
class Agent(Protocol):
    """Kind ``agent``: built as ``cls(params, context)`` with a ``SourceContext``.

    Optional: ``async continue_sample(sample, client, sampling_params) -> Sample`` (for
    ``rollout.partial``), ``continues_turns_in_place`` (class attribute), ``tool_schemas()``,
    ``use_router(router)`` with ``router_settings(base)``.
    """

    async def run_group(self, prompt: Prompt, n: int, client: GenerationClient,
                        sampling_params: dict[str, Any]) -> list[Sample]: ...


class Reward(Protocol):
    """Kind ``reward``: a module-level callable (it is pickled into reward worker processes).

    ``context`` holds ``prompt``, ``sample`` and ``sandbox`` (a ``SandboxFactory`` or None).
    A dict result holds ``"score"`` and may hold more numeric fields.
    """

    def __call__(self, sample_text: str, ground_truth: Any, params: Any,
                 **context: Any) -> float | dict[str, Any]: ...


@runtime_checkable
class Sandbox(Protocol):
    """Kind ``sandbox``: built as ``cls(params, files=..., untrusted=..., key=...)`` (``key``: the
    config key that named it, for its errors), an async context manager; ``cls.pool(params,
    size=...)`` gives a pool of them. An operation it cannot carry out raises a ``LoongSageError``."""

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(self, *exc: object) -> None: ...

    async def exec(self, command: str | Sequence[str], *, stdin: bytes | str | None = None,
                   timeout: float | None = None) -> Any: ...

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None: ...

    async def read_file(self, path: str, max_bytes: int = 16 << 20) -> bytes: ...

    async def list_files(self, path: str = ".") -> list[Any]: ...

    async def reset(self) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class Dataset(Protocol):
    """Kind ``dataset``: built as ``cls(params, seed)``; ``get`` is a pure function of the seed
    and the index, so a resumed run draws the same prompts. ``__len__`` is optional (omit it
    for an infinite source)."""

    def get(self, index: int) -> Prompt: ...


@runtime_checkable
class Environment(Protocol):
    """Kind ``environment``: built as ``cls(params, context)`` with an ``EnvironmentContext``;
    bound to a data source in place of its dataset, agent and reward.

    ``tasks(split)`` (``"train"`` or ``"held_out"``) returns a ``Dataset`` of the split's tasks
    (``get(index) -> Prompt``, and ``__len__``). ``run_episode`` makes its model calls through the
    ``Endpoint``'s router URLs and returns the ``Episode``'s reward and metrics.
    """

    def tasks(self, split: str) -> Dataset: ...

    async def run_episode(self, task: Prompt, endpoint: Endpoint) -> Episode: ...


class AdvantageEstimator(Protocol):
    """Kind ``advantage``: ``fn(inputs, params) -> Tensor [N, L]``, zero outside the loss mask.

    Optional: ``needs_values = True`` on the parameter class (it reads per-token values, which
    a step term supplies) with ``fn.returns`` (the value targets), ``group_baseline`` on the
    parameter instance.
    """

    def __call__(self, inputs: AdvantageInputs, params: Any) -> torch.Tensor: ...


class PolicyLoss(Protocol):
    """Kind ``policy_loss``: per-token loss [N, L]; aggregation is the objective's job.
    Optional: ``fn.prepare(inputs, params) -> dict`` for statistics of the whole mini-batch."""

    def __call__(self, inputs: PolicyLossInputs, params: Any) -> PolicyLossOutput: ...


class KLPolicy(Protocol):
    """Kind ``kl_policy``, token level: ``fn(logprobs [N, L], ref_logprobs [N, L]) -> [N, L]``.
    A logit-level policy (``kl_targets`` on its parameter class) is a ``LogitKLPolicy``."""

    def __call__(self, logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor: ...


class LogitKLPolicy(Protocol):
    """Kind ``kl_policy``, logit level: one chunk of ``c`` positions inside the train engine's
    LM head, against a target distribution (its full log-softmax, or its top-k log-probs and
    their token ids); differentiated with respect to ``logits`` only, and deterministic."""

    def __call__(self, logits: torch.Tensor, target_logprobs: torch.Tensor,
                 target_ids: torch.Tensor | None, beta: float) -> torch.Tensor: ...


class ISCorrection(Protocol):
    """Kind ``is_correction``: a detached per-token weight and/or keep mask for the policy loss."""

    def __call__(self, inputs: PolicyLossInputs, params: Any) -> Correction: ...


class DataFilter(Protocol):
    """Kind ``data_filter``: keeps some of the groups, with float metrics."""

    def __call__(self, groups: list[Group], params: Any) -> FilterResult: ...


@runtime_checkable
class Engine(Protocol):
    """Kind ``engine``: a class hosted in a Ray actor, built by ``from_config(cfg, device=...)``
    (``device`` is ``cuda:0`` when Ray gave the actor a GPU, else ``cpu``). What else it has
    depends on its role: ``TrainEngine`` and ``RolloutEngine`` (which opens the run's
    ``WeightSync``) are the protocols of the two main ones; docs/plugins.md §4 lists the
    methods of the step terms' engines too."""

    @classmethod
    def from_config(cls, cfg: Any, device: str | None = None) -> Engine: ...


class Command(Protocol):
    """Kind ``command``: ``loongsage NAME ARGS...`` calls ``main(ARGS, registries)``; the
    result is the exit code."""

    def __call__(self, argv: list[str], registries: Registries) -> int: ...


# kind -> the name in ``loongsage.plugin`` of its contract type (a Protocol or a base class)
KIND_CONTRACTS: Mapping[str, str] = {kind.name: kind.contract for kind in KIND_TABLE}
