"""Core's ``replay`` command, registered through the same hook as third-party commands."""

from loongsage.hookspecs import hookimpl


@hookimpl
def loongsage_register_commands(register):
    register("replay", "loongsage.controller.replay_command:main",
             doc="Recompute one step of a finished run beside its logged metrics (--dump, --override).")
