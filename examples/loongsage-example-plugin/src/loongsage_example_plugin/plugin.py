"""Hook implementations only: cheap to import, the objects load lazily by name."""

from loongsage.plugin import hookimpl

from loongsage_example_plugin.params import CsvParams, ExactMatchParams


@hookimpl
def loongsage_register_trackers(register):
    register("csv", "loongsage_example_plugin.csv_tracker:CsvTracker", params=CsvParams)


@hookimpl
def loongsage_register_rewards(register):
    register("exact_match", "loongsage_example_plugin.exact_match:exact_match", params=ExactMatchParams)


@hookimpl
def loongsage_register_commands(register):
    register("csv-tail", "loongsage_example_plugin.csv_command:main",
             doc="Print the last rows of a run's csv tracker file.")
