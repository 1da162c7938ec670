"""The plugin kinds, declared once: the table the hooks, registries and config groups come from.

Each ``KindSpec`` is one plugin kind: its registry name, its registration hook (and the
hook's one-line description), the config fields that name a plugin of the kind, the config
key an error names by default, and its contract type (a name of ``loongsage.plugin``).
``hookspecs`` builds one hook per entry, ``registry.KINDS`` is this table by name,
``config.store.PLUGIN_GROUPS`` has one Hydra config group per field,
``loongsage.plugin.KIND_CONTRACTS`` maps each kind to its contract, and config validation
resolves each field under its ``KindSpec.key`` and ``name_field``. Adding a kind is one
entry here plus its contract type and its check (docs/plugins.md shows the diff).

A field's config group is its path with ``[*]`` dropped and dots as slashes
(``data_sources[*].agent`` -> ``data_sources/agent``). A field holding one mapping node
named by ``name`` is *selectable* (``algorithm/policy_loss=m2po`` swaps the node); the
options of the others are listed, not selected (``config.store``).
"""

from __future__ import annotations

from dataclasses import dataclass

LISTING_ROOT = "plugin_options"  # where the ConfigStore keeps the options of unselectable groups
SOURCE_FIELD = "data_sources[*]."  # the prefix of a field that each data source sets


@dataclass(frozen=True)
class PluginGroup:
    """The config group of one plugin-naming field: its path, plugin kind and name field."""

    group: str  # Hydra group path, e.g. "algorithm/policy_loss"
    kind: str  # registry kind whose plugins are its options
    field: str  # where the config names the plugin, e.g. "data_sources[*].agent"
    name_field: str = "name"  # the node's key holding the plugin name ("" for a bare name)
    selectable: bool = False  # `group=option` swaps the node (single config nodes only)

    @property
    def path(self) -> str:
        """Where the options live in the ConfigStore: the group itself when selectable, else
        under ``plugin_options/``, so that no config section (``train``, ``data_sources``)
        becomes a Hydra group directory and whole-section overrides (``train={lr: 0.5}``)
        keep working."""
        return self.group if self.selectable else f"{LISTING_ROOT}/{self.group}"


@dataclass(frozen=True)
class KindSpec:
    """One plugin kind (module docstring)."""

    name: str
    hook: str
    doc: str  # the hook's description
    contract: str  # its contract type in loongsage.plugin (a Protocol or a base class)
    config_field: str  # the key an unknown name's error names when the caller gives none
    fields: tuple[tuple[str, str], ...] = ()  # (config path, name field: "" for a bare name)
    named_by: str = ""  # what picks a plugin of a kind that no config field names

    @property
    def name_field(self) -> str:
        """The key of a node of this kind that names its plugin: ``name`` unless the kind's fields
        say otherwise (``format`` for a dataset, ``type`` for a sandbox or an environment)."""
        return next((name for _, name in self.fields if name), "name")

    def key(self, source: int | None = None) -> str:
        """The config key of this kind's field, as validation resolves it and its errors name it.

        A data source's field takes the source's index (``dataset``, 2 -> ``data_sources[2].dataset``),
        any other field none (``policy_loss`` -> ``algorithm.policy_loss``); a list field is named
        without its ``[*]`` (``Registries.resolve_all`` numbers the entries). A kind with two fields
        of the same sort (``engine``: ``train.backend`` and ``rollout.backend``) has no one key.
        """
        per_source = source is not None
        paths = [path for path, _ in self.fields if path.startswith(SOURCE_FIELD) == per_source]
        if len(paths) != 1:
            where = "per-source" if per_source else "run-wide"
            raise ValueError(f"kind {self.name!r} has {len(paths)} {where} fields ({paths}); name the key")
        path = paths[0].removesuffix("[*]")
        return path.replace(SOURCE_FIELD, f"data_sources[{source}].", 1) if per_source else path

    def groups(self) -> tuple[PluginGroup, ...]:
        """One config group per field (module docstring)."""
        return tuple(
            PluginGroup(path.replace("[*]", "").replace(".", "/"), self.name, path, name_field,
                        selectable="[*]" not in path and name_field == "name")
            for path, name_field in self.fields
        )


KIND_TABLE: tuple[KindSpec, ...] = (
    KindSpec("agent", "loongsage_register_agents",
             "Register agent loops (white-box) and agent launchers (black-box).",
             "Agent", "data_sources[*].agent.name", (("data_sources[*].agent", "name"),)),
    KindSpec("reward", "loongsage_register_rewards", "Register reward functions.",
             "Reward", "data_sources[*].reward.name", (("data_sources[*].reward", "name"),)),
    KindSpec("sandbox", "loongsage_register_sandboxes", "Register sandbox backends.",
             "Sandbox", "data_sources[*].sandbox.type", (("data_sources[*].sandbox", "type"),)),
    KindSpec("dataset", "loongsage_register_datasets", "Register dataset formats (prompt sources).",
             "Dataset", "data_sources[*].dataset.format", (("data_sources[*].dataset", "format"),)),
    KindSpec("environment", "loongsage_register_environments",
             "Register environments: the tasks, episodes and rewards of a data source in place of its "
             "dataset, agent and reward.",
             "Environment", "data_sources[*].environment.type", (("data_sources[*].environment", "type"),)),
    KindSpec("tool_parser", "loongsage_register_tool_parsers",
             "Register parsers that turn generated text into tool calls.",
             "ToolParser", "agentflow.tool_parser", (("agentflow.tool_parser", ""),)),
    KindSpec("router_middleware", "loongsage_register_router_middlewares",
             "Register AgentFlow router middlewares.",
             "RouterMiddleware", "agentflow.middlewares", (("agentflow.middlewares[*]", "name"),)),
    KindSpec("advantage", "loongsage_register_advantage_estimators", "Register advantage estimators.",
             "AdvantageEstimator", "algorithm.advantage_estimator",
             (("algorithm.advantage_estimator", "name"),)),
    KindSpec("policy_loss", "loongsage_register_policy_losses", "Register policy losses.",
             "PolicyLoss", "algorithm.policy_loss", (("algorithm.policy_loss", "name"),)),
    KindSpec("kl_policy", "loongsage_register_kl_policies",
             "Register KL estimators usable as a loss term or a reward penalty.",
             "KLPolicy", "algorithm.kl.method",
             (("algorithm.kl.method", ""),)),
    KindSpec("is_correction", "loongsage_register_is_corrections",
             "Register rollout/training mismatch (importance-sampling) corrections.",
             "ISCorrection", "algorithm.is_correction", (("algorithm.is_correction", "name"),)),
    KindSpec("data_filter", "loongsage_register_data_filters",
             "Register filters applied to prompt groups or samples before training.",
             "DataFilter", "algorithm.filters",
             (("algorithm.filters[*]", "name"), ("data_sources[*].filters[*]", "name"))),
    KindSpec("window_policy", "loongsage_register_window_policies",
             "Register async window policies (dispatch and collection gates).",
             "WindowPolicy", "async.window_policy", (("async.window_policy", "name"),)),
    KindSpec("engine", "loongsage_register_engines",
             "Register engine backends: train, rollout, and those a step term hosts in actors of its own.",
             "Engine", "train.backend", (("train.backend", ""), ("rollout.backend", ""))),
    KindSpec("tracker", "loongsage_register_trackers", "Register metric trackers.",
             "Tracker", "logging.trackers", (("logging.trackers[*]", "name"),)),
    KindSpec("step_term", "loongsage_register_step_terms",
             "Register step terms: extensions of the training step that own a config section and add batch "
             "inputs, advantage shaping, loss terms or actors of their own.",
             "StepTermPlugin", "step term", named_by="its own config section, when set"),
    KindSpec("command", "loongsage_register_commands",
             "Register ``loongsage`` subcommands: ``main(argv, registries) -> exit code``.",
             "Command", "loongsage <command>", named_by="the command line"),
)

KINDS: dict[str, KindSpec] = {kind.name: kind for kind in KIND_TABLE}
