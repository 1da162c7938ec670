"""Registrations of loongsage-sandbox: only hook implementations, cheap to import (no torch).

Each backend is registered as its class (lazily, by ``"module:attr"``): build one with
``cls(params, files=..., untrusted=...)`` and use it as an async context manager.
"""

from loongsage.plugin import hookimpl
from loongsage_sandbox.params import BwrapParams, DockerParams, ProcessParams, RemoteParams


@hookimpl
def loongsage_register_sandboxes(register):
    register("bwrap", "loongsage_sandbox.bwrap:BwrapSandbox", params=BwrapParams)
    register("process", "loongsage_sandbox.process:ProcessSandbox", params=ProcessParams)
    register("docker", "loongsage_sandbox.docker:DockerSandbox", params=DockerParams)
    register("remote", "loongsage_sandbox.remote:RemoteSandbox", params=RemoteParams)


@hookimpl
def loongsage_register_commands(register):
    register("sandbox", "loongsage_sandbox.cli:main",
             doc="Run a command in a sandbox, serve remote sandboxes, clean up leftovers.")
