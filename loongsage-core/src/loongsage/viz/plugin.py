"""Core's ``plot`` and ``view`` commands, registered through the same hook as third-party commands."""

from loongsage.hookspecs import hookimpl


@hookimpl
def loongsage_register_commands(register):
    register("plot", "loongsage.viz.commands:plot_main",
             doc="Draw runs' curves (reward, eval accuracy, KL, staleness, timing) to a PNG.")
    register("view", "loongsage.viz.commands:view_main",
             doc="Serve the trajectory viewer page over a run directory (loopback).")
