"""Core's built-in ``models`` command, registered through the same hook as third-party commands."""

from loongsage.hookspecs import hookimpl


@hookimpl
def loongsage_register_commands(register):
    register("models", "loongsage.models.command:main",
             doc="Build the tiny test model or convert SmolLM2-135M-Instruct; print its folder.")
