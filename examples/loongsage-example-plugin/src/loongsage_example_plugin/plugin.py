"""Hook implementations only: cheap to import, the objects load lazily by name.

One entry of every plugin kind, each in a module of its own (``tests/test_contracts.py``
checks that every kind of ``loongsage.plugin.KIND_CONTRACTS`` has one).
"""

from loongsage.plugin import hookimpl

from loongsage_example_plugin import params as p

_PKG = "loongsage_example_plugin"


@hookimpl
def loongsage_register_agents(register):
    register("plain_prompt", f"{_PKG}.plain_prompt:PlainPrompt", params=p.PlainPromptParams)


@hookimpl
def loongsage_register_rewards(register):
    register("exact_match", f"{_PKG}.exact_match:exact_match", params=p.ExactMatchParams)


@hookimpl
def loongsage_register_sandboxes(register):
    register("tempdir", f"{_PKG}.tempdir_sandbox:TempdirSandbox", params=p.TempdirParams)


@hookimpl
def loongsage_register_datasets(register):
    register("fixed_list", f"{_PKG}.fixed_list:FixedList", params=p.FixedListParams)


@hookimpl
def loongsage_register_environments(register):
    register("static_tasks", f"{_PKG}.static_tasks:StaticTasks", params=p.StaticTasksParams)


@hookimpl
def loongsage_register_tool_parsers(register):
    register("bracket", f"{_PKG}.bracket_parser:BracketParser",
             doc="One line per tool call: [[call NAME {json arguments}]].")


@hookimpl
def loongsage_register_router_middlewares(register):
    register("header_tag", f"{_PKG}.header_tag:HeaderTag", params=p.HeaderTagParams)


@hookimpl
def loongsage_register_advantage_estimators(register):
    register("median_baseline", f"{_PKG}.median_baseline:median_baseline", params=p.MedianBaselineParams)


@hookimpl
def loongsage_register_policy_losses(register):
    register("clipped_reinforce", f"{_PKG}.clipped_reinforce:clipped_reinforce",
             params=p.ClippedReinforceParams)


@hookimpl
def loongsage_register_kl_policies(register):
    register("abs_log_ratio", f"{_PKG}.abs_log_ratio:abs_log_ratio", params=p.AbsLogRatioParams)


@hookimpl
def loongsage_register_is_corrections(register):
    register("token_cap", f"{_PKG}.token_cap:token_cap", params=p.TokenCapParams)


@hookimpl
def loongsage_register_data_filters(register):
    register("length_cap", f"{_PKG}.length_cap:length_cap", params=p.LengthCapParams)


@hookimpl
def loongsage_register_window_policies(register):
    register("max_in_flight", f"{_PKG}.max_in_flight:MaxInFlight", params=p.MaxInFlightParams)


@hookimpl
def loongsage_register_engines(register):
    register("frozen_scorer", f"{_PKG}.frozen_scorer:FrozenScorer",
             doc="A frozen causal LM scoring token log-probs, in an actor a step term starts.")


@hookimpl
def loongsage_register_trackers(register):
    register("csv", f"{_PKG}.csv_tracker:CsvTracker", params=p.CsvParams)


@hookimpl
def loongsage_register_step_terms(register):
    register("entropy_bonus", f"{_PKG}.entropy_bonus:ENTROPY_BONUS",
             doc="An entropy bonus in the training loss (entropy_bonus.coef).")


@hookimpl
def loongsage_register_commands(register):
    register("csv-tail", f"{_PKG}.csv_command:main", doc="Print the last rows of a run's csv tracker file.")
