"""Hook specifications: one registration hook per plugin kind.

Every hook receives a ``register(name, obj, *, params=None, doc=None)`` callable and
returns nothing, so one plugin module can register zero, one or many entries of a kind.
``params`` is an optional dataclass type describing the entry's typed parameters; the
registry publishes it to Hydra's ConfigStore. ``doc`` defaults to the first line of
``obj.__doc__``. The contract each registered object must honour is documented once, in
``docs/plugins.md``.
"""

import pluggy

hookspec = pluggy.HookspecMarker("loongsage")
hookimpl = pluggy.HookimplMarker("loongsage")


@hookspec
def loongsage_register_agents(register):
    """Register agent loops (white-box) and agent launchers (black-box)."""


@hookspec
def loongsage_register_rewards(register):
    """Register reward functions."""


@hookspec
def loongsage_register_sandboxes(register):
    """Register sandbox backends."""


@hookspec
def loongsage_register_environments(register):
    """Register environments: the tasks, episodes and rewards of a data source (``data.environments``)."""


@hookspec
def loongsage_register_datasets(register):
    """Register dataset formats (prompt sources)."""


@hookspec
def loongsage_register_tool_parsers(register):
    """Register parsers that turn generated text into tool calls."""


@hookspec
def loongsage_register_router_middlewares(register):
    """Register AgentFlow router middlewares."""


@hookspec
def loongsage_register_advantage_estimators(register):
    """Register advantage estimators."""


@hookspec
def loongsage_register_policy_losses(register):
    """Register policy losses."""


@hookspec
def loongsage_register_kl_policies(register):
    """Register KL estimators usable as a loss term or a reward penalty."""


@hookspec
def loongsage_register_is_corrections(register):
    """Register rollout/training mismatch (importance-sampling) corrections."""


@hookspec
def loongsage_register_data_filters(register):
    """Register filters applied to prompt groups or samples before training."""


@hookspec
def loongsage_register_window_policies(register):
    """Register async window policies (dispatch and collection gates)."""


@hookspec
def loongsage_register_engines(register):
    """Register train, rollout and teacher engine backends."""


@hookspec
def loongsage_register_trackers(register):
    """Register metric trackers."""


@hookspec
def loongsage_register_distillers(register):
    """Register distillers: teacher outputs for each training batch and the loss terms they feed."""


@hookspec
def loongsage_register_commands(register):
    """Register ``loongsage`` subcommands: ``main(argv, registries) -> exit code``."""
