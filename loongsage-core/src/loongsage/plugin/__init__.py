"""``loongsage.plugin``: the whole public API for plugin authors, and the only part of core a
plugin distribution imports (``loongsage.plugin.testing`` holds the contract checks and the
test helpers).

What is here, by group (each name below is listed with the reason it is public):

- ``hookimpl``, the marker of hook implementations (``hookspecs.py`` has one hook per kind);
- the contract type of each plugin kind (``KIND_CONTRACTS``: a ``Protocol``, or the base
  class the kind subclasses);
- the records plugins receive and return;
- the errors plugins raise or catch;
- the helpers plugin distributions need from core (the train engine's log-prob pieces for
  a step term's engine, the router for router-based agents, ...).

The names stay where the code lives and are re-exported from here on first use, so
``from loongsage.plugin import hookimpl`` in a plugin's entry-point module imports neither
torch nor the web stack, and ``loongsage plugins`` stays fast. Everything else in ``loongsage``
is private to core: ``lint-imports`` (``[tool.importlinter]`` in the repository's
``pyproject.toml``) fails when a plugin distribution imports anything else.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from loongsage.hookspecs import hookimpl

# public name -> (the module it lives in, why it is public)
PUBLIC: dict[str, tuple[str, str]] = {
    # ---- contracts: one per kind ----------------------------------------------------------
    "KIND_CONTRACTS": ("loongsage.plugin.kinds", "the contract type of every plugin kind, by kind"),
    "Agent": ("loongsage.plugin.kinds", "contract of kind agent"),
    "GenerationClient": ("loongsage.plugin.kinds", "what an agent's run_group gets as client"),
    "Reward": ("loongsage.plugin.kinds", "contract of kind reward"),
    "Sandbox": ("loongsage.plugin.kinds", "contract of kind sandbox"),
    "Dataset": ("loongsage.plugin.kinds", "contract of kind dataset"),
    "Environment": ("loongsage.plugin.kinds", "contract of kind environment"),
    "ToolParser": ("loongsage.agentflow.tool_calls", "contract of kind tool_parser"),
    "RouterMiddleware": ("loongsage.agentflow.middleware", "base class of kind router_middleware"),
    "AdvantageEstimator": ("loongsage.plugin.kinds", "contract of kind advantage"),
    "PolicyLoss": ("loongsage.plugin.kinds", "contract of kind policy_loss"),
    "KLPolicy": ("loongsage.plugin.kinds", "contract of kind kl_policy (token level)"),
    "LogitKLPolicy": ("loongsage.plugin.kinds", "contract of kind kl_policy (logit level, distillation)"),
    "ISCorrection": ("loongsage.plugin.kinds", "contract of kind is_correction"),
    "DataFilter": ("loongsage.plugin.kinds", "contract of kind data_filter"),
    "WindowPolicy": ("loongsage.runtime.window", "base class of kind window_policy"),
    "Engine": ("loongsage.plugin.kinds", "contract of kind engine"),
    "TrainEngine": ("loongsage.engines.protocols", "what a train engine (train.backend) implements"),
    "RolloutEngine": ("loongsage.engines.protocols", "what a rollout engine (rollout.backend) implements"),
    "WeightSync": ("loongsage.engines.weight_sync", "the weight transport a rollout engine's weight_sync opens"),
    "TrainRanks": ("loongsage.engines.weight_sync", "the train ranks, as a weight sync reaches them"),
    "Tracker": ("loongsage.tracking.base", "base class of kind tracker"),
    "StepTermPlugin": ("loongsage.config.step_terms", "contract of kind step_term"),
    "StepExtension": ("loongsage.config.step_terms", "what a step term's build returns: batch inputs, actors"),
    "StepTerm": ("loongsage.algorithms.step_term", "the train-side half of a step term, run in the train actor"),
    "Command": ("loongsage.plugin.kinds", "contract of kind command"),
    # ---- records plugins receive and return -----------------------------------------------
    "Prompt": ("loongsage.data.types", "what a dataset returns and an agent receives"),
    "Sample": ("loongsage.data.types", "what an agent returns: tokens, logprobs, loss mask, reward"),
    "Group": ("loongsage.data.types", "a prompt's samples, as a data filter sees them"),
    "FilterResult": ("loongsage.algorithms.filters", "what a data filter returns"),
    "SourceContext": ("loongsage.data.sources", "what an agent is built with: tokenizer, sandbox, registries"),
    "SandboxFactory": ("loongsage.data.sources", "the sandbox an agent or a reward receives"),
    "EnvironmentContext": ("loongsage.data.environments", "what an environment is built with: source, seed, sandbox"),
    "Endpoint": ("loongsage.data.environments", "where an episode calls the policy: router URLs, key, model"),
    "Episode": ("loongsage.data.environments", "what an environment's run_episode returns: reward, metrics"),
    "GenerateOutput": ("loongsage.engines.replies", "what GenerationClient.agenerate returns"),
    "ToolCall": ("loongsage.agentflow.tool_calls", "what a tool parser parses and renders"),
    "ParsedOutput": ("loongsage.agentflow.tool_calls", "what a tool parser's parse returns"),
    "TurnContext": ("loongsage.agentflow.middleware", "one router request, as a middleware sees it"),
    "WindowView": ("loongsage.runtime.window", "the pipeline state a window policy decides on"),
    "SAMPLE_COLUMNS": ("loongsage.tracking.base", "the columns of the rows a tracker's log_samples gets"),
    "AdvantageInputs": ("loongsage.algorithms.types", "what an advantage estimator receives"),
    "PolicyLossInputs": ("loongsage.algorithms.types", "what a policy loss or an IS correction receives"),
    "PolicyLossOutput": ("loongsage.algorithms.types", "what a policy loss returns"),
    "Correction": ("loongsage.algorithms.types", "what an IS correction returns"),
    "TrainBatch": ("loongsage.engines.batch", "the batch a step term writes its inputs into"),
    "LossContext": ("loongsage.engines.batch", "one micro-batch, as a loss term (StepTerm.loss) sees it"),
    "LogitTerm": ("loongsage.engines.batch", "values a loss term computes inside the chunked LM head"),
    "Registries": ("loongsage.registry", "the run's registries, handed to commands and agents (SourceContext)"),
    "RegistryEntry": ("loongsage.registry", "one registered plugin, as the registries hold it"),
    "PluginRef": ("loongsage.registry", "a resolved config reference to a plugin, with typed params"),
    "StepContext": ("loongsage.config.step_terms", "what a step term's extension is built from"),
    "MemoryShare": ("loongsage.config.step_terms", "what a step term adds to the start-up memory estimate"),
    # ---- errors ---------------------------------------------------------------------------
    "LoongSageError": ("loongsage.errors", "base of every error core raises on purpose; a sandbox raises it"),
    "ConfigError": ("loongsage.errors", "a bad config value, naming its key: the error for bad params"),
    "DuplicatePluginError": ("loongsage.errors", "two plugins claim one name of a kind"),
    "UnknownPluginError": ("loongsage.errors", "a config names a plugin nobody registered"),
    "PluginImportError": ("loongsage.errors", "a lazy 'module:attribute' target failed to import"),
    "RegistryFrozenError": ("loongsage.errors", "a registration after loading ended"),
    "EngineError": ("loongsage.engines.replies", "a GenerationClient call the engine refused or failed"),
    # ---- helpers for algorithm plugins ----------------------------------------------------
    "group_stats": ("loongsage.algorithms.advantages", "per-group mean and std, as the grpo estimator computes them"),
    "broadcast": ("loongsage.algorithms.advantages", "a per-row value over its loss-masked tokens"),
    "masked_whiten": ("loongsage.algorithms.advantages", "whitening over the loss-masked tokens"),
    "log_mismatch": ("loongsage.algorithms.mismatch", "log(pi_old / pi_rollout), as IS corrections read it"),
    "aggregate": ("loongsage.algorithms.aggregation", "the objective's loss aggregation, for a loss term of its own"),
    "advantage_inputs": ("loongsage.algorithms.advantages", "an estimator's inputs as the step builds them, for value targets"),
    # ---- helpers for engine plugins (a step term's engine reuses the train engine's pieces) ---
    "load_causal_lm": ("loongsage.engines.embedded_train", "a HF causal LM loaded as the train engine loads it"),
    "final_hidden": ("loongsage.engines.logprobs", "the decoder's last hidden state at scored positions"),
    "head_scores": ("loongsage.engines.logprobs", "log-probs and LogitTerm values from the chunked LM head"),
    "scatter_positions": ("loongsage.engines.logprobs", "scored positions back into [N, L] tensors"),
    "token_scores": ("loongsage.engines.logprobs", "the train engine's log-probs of a batch, end to end"),
    "SingleProcess": ("loongsage.engines.distributed", "the parallel place of a train engine that is one rank"),
    "MeshWeightSync": ("loongsage.engines.mesh_sync", "TransferMesh into the engine's process (apply_weights)"),
    "engine_values": ("loongsage.engines.weight_sync", "a call in every engine actor, None where one died"),
    "resolve_model_path": ("loongsage.models.resolve", "model.path as core resolves it (tiny, smollm2, hub ids)"),
    "EmbeddedTrainEngine": ("loongsage.engines.embedded_train", "the embedded trainer, which a value model engine extends"),
    "ModelConfig": ("loongsage.schema", "the model section, as an engine reads it (config_section)"),
    "TrainConfig": ("loongsage.schema", "the train section, as a train-side engine reads it (train_section)"),
    "config_section": ("loongsage.engines.sections", "a config section as its dataclass, for an engine's from_config"),
    "train_section": ("loongsage.engines.sections", "the train section with its backend's keys, for a train-side engine"),
    "scatter_rows": ("loongsage.engines.micro_batches", "micro-batch results back into the batch's row order"),
    "read_weights": ("loongsage.engines.train_state", "a HF folder's weights, as the trainer loads them"),
    "check_loaded": ("loongsage.engines.train_state", "the trainer's check that a folder's weights fit the model"),
    "checkpoint_files": ("loongsage.models.weight_files", "a model folder's safetensors files"),
    # ---- helpers for step term plugins ----------------------------------------------------
    "ModelShape": ("loongsage.controller.memory_budget", "a model folder's sizes, for a memory estimate"),
    "PROCESS_BYTES": ("loongsage.controller.memory_budget", "what one worker process holds, for a memory estimate"),
    "dtype_bytes": ("loongsage.controller.memory_budget", "bytes per value of a model.dtype"),
    "closest": ("loongsage.hints", "the closest of some names to a misspelt one, for a 'did you mean' hint"),
    # ---- helpers for agent plugins --------------------------------------------------------
    "SEED_KEY": ("loongsage.engines.sampling_seed", "the sampling_params field holding a request's seed"),
    "sample_seed": ("loongsage.engines.sampling_seed", "the seed of a group's i-th sample, as core derives it"),
    "EnginePool": ("loongsage.engines.pool", "the run's GenerationClient, which a router-based agent wraps"),
    "Router": ("loongsage.agentflow.server", "the AgentFlow router a router-based agent runs its turns through"),
    "RouterSettings": ("loongsage.agentflow.settings", "the agentflow settings a router is started with"),
    "RouterPlugins": ("loongsage.config.router_plugins", "a router's resolved middlewares and tool parser"),
    "resolve_router_plugins": ("loongsage.config.router_plugins",
                               "a router's middlewares and tool parser resolved once (an agent's own middlewares)"),
    "extra_command": ("loongsage.install_hints", "the pip command installing an extra, for a missing-package error"),
}

__all__ = ["hookimpl", *PUBLIC]


def __getattr__(name: str) -> Any:
    try:
        module, _ = PUBLIC[name]
    except KeyError:
        raise AttributeError(f"module 'loongsage.plugin' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(PUBLIC))


if __doc__ is not None:
    __doc__ += "\nPublic names:\n\n" + "\n".join(f"- ``{name}``: {why}" for name, (_, why) in PUBLIC.items())

if TYPE_CHECKING:  # for type checkers and editors; at run time the names load on first use
    from loongsage.agentflow.middleware import RouterMiddleware, TurnContext
    from loongsage.agentflow.server import Router
    from loongsage.agentflow.settings import RouterSettings
    from loongsage.config.router_plugins import RouterPlugins, resolve_router_plugins
    from loongsage.agentflow.tool_calls import ParsedOutput, ToolCall, ToolParser
    from loongsage.algorithms.advantages import advantage_inputs, broadcast, group_stats, masked_whiten
    from loongsage.algorithms.aggregation import aggregate
    from loongsage.algorithms.filters import FilterResult
    from loongsage.algorithms.mismatch import log_mismatch
    from loongsage.algorithms.step_term import StepTerm
    from loongsage.algorithms.types import AdvantageInputs, Correction, PolicyLossInputs, PolicyLossOutput
    from loongsage.config.step_terms import MemoryShare, StepContext, StepExtension, StepTermPlugin
    from loongsage.controller.memory_budget import PROCESS_BYTES, ModelShape, dtype_bytes
    from loongsage.data.environments import Endpoint, EnvironmentContext, Episode
    from loongsage.data.sources import SandboxFactory, SourceContext
    from loongsage.data.types import Group, Prompt, Sample
    from loongsage.engines.batch import LogitTerm, LossContext, TrainBatch
    from loongsage.engines.replies import EngineError, GenerateOutput
    from loongsage.engines.distributed import SingleProcess
    from loongsage.engines.embedded_train import EmbeddedTrainEngine, load_causal_lm
    from loongsage.engines.micro_batches import scatter_rows
    from loongsage.engines.sections import config_section, train_section
    from loongsage.engines.train_state import check_loaded, read_weights
    from loongsage.engines.logprobs import final_hidden, head_scores, scatter_positions, token_scores
    from loongsage.engines.mesh_sync import MeshWeightSync
    from loongsage.engines.pool import EnginePool
    from loongsage.engines.protocols import RolloutEngine, TrainEngine
    from loongsage.engines.sampling_seed import SEED_KEY, sample_seed
    from loongsage.engines.weight_sync import TrainRanks, WeightSync, engine_values
    from loongsage.errors import (
        ConfigError, DuplicatePluginError, LoongSageError, PluginImportError, RegistryFrozenError, UnknownPluginError,
    )
    from loongsage.hints import closest
    from loongsage.install_hints import extra_command
    from loongsage.models.resolve import resolve_model_path
    from loongsage.models.weight_files import checkpoint_files
    from loongsage.plugin.kinds import (
        KIND_CONTRACTS, AdvantageEstimator, Agent, Command, DataFilter, Dataset, Engine, Environment,
        GenerationClient, ISCorrection, KLPolicy, LogitKLPolicy, PolicyLoss, Reward, Sandbox,
    )
    from loongsage.registry import PluginRef, Registries, RegistryEntry
    from loongsage.runtime.window import WindowPolicy, WindowView
    from loongsage.schema import ModelConfig, TrainConfig
    from loongsage.tracking.base import SAMPLE_COLUMNS, Tracker
