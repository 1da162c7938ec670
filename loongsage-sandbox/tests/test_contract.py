"""Every registered sandbox backend passes the shared contract (where it can run here)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import pytest
from tool_guard import optional_skip

from loongsage.plugin.testing import installed_registries
from loongsage_sandbox.testing import bwrap_unavailable_reason, check_sandbox_contract

NAMES = installed_registries().sandbox.names()


def _docker_engine() -> bool:
    docker = shutil.which("docker")
    try:
        return bool(docker) and subprocess.run([docker, "version"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.parametrize("name", NAMES)
def test_registered_backend_passes_the_contract(name, request):
    params: dict = {}
    if name == "bwrap" and bwrap_unavailable_reason():
        pytest.skip(bwrap_unavailable_reason())
    if name == "docker":
        if not _docker_engine():
            optional_skip("no Docker engine on this machine; see test_docker.py for the launch path")
        params = {"pull": True}
    if name == "process":
        params = {"allow_untrusted_code": True}
    if name == "remote":
        svc = request.getfixturevalue("service")
        params = {"url": svc.url, "token": svc.token}
    asyncio.run(check_sandbox_contract(installed_registries().sandbox.get(name), params))


def test_every_backend_has_typed_params_and_a_doc():
    for entry in installed_registries().sandbox:
        assert entry.params is not None and entry.doc, entry.name
        names = [p["name"] for p in entry.param_schema()]
        assert {"timeout_s", "memory_mb", "cpu_time_s", "disk_mb", "max_processes"} <= set(names), entry.name
