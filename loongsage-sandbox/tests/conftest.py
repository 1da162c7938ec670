"""Fixtures: registered sandbox classes, a real sandbox service, hostile-code targets."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from typing import Any, Callable

import pytest

from loongsage.plugin.testing import installed_registries
from loongsage_sandbox.testing import bwrap_unavailable_reason

BWRAP_REASON = bwrap_unavailable_reason()
HAS_BWRAP = BWRAP_REASON is None


def sandbox_class(name: str) -> Any:
    return installed_registries().sandbox.get(name)


@pytest.fixture(autouse=True, scope="session")
def _private_state_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep this session's sandbox state apart from other runs on the machine."""
    path = tmp_path_factory.mktemp("sandbox-state")
    os.chmod(path, 0o711)
    os.environ["LOONGSAGE_SANDBOX_STATE_DIR"] = str(path)


class Service:
    """A running ``loongsage sandbox serve`` subprocess."""

    def __init__(self, *extra: str):
        self.token = secrets.token_hex(16)
        env = {**os.environ, "LOONGSAGE_SANDBOX_TOKEN": self.token}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "loongsage.cli", "sandbox", "serve", "--backend", "bwrap", "--port", "0",
             "--memory", "512", "--timeout", "30", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()
        if "serving" not in line:
            self.proc.kill()
            raise RuntimeError(f"sandbox service did not start: {line!r} {self.proc.stderr.read()}")
        self.url = line.strip().rsplit(" ", 1)[1]
        try:
            _wait_healthy(self.url, self.token)
        except BaseException:  # a service that never gets healthy must not outlive the test
            self.proc.kill()
            raise

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(20)


@pytest.fixture(scope="session")
def service() -> Any:
    """A real ``loongsage sandbox serve --backend bwrap`` process on a free loopback port."""
    if not HAS_BWRAP:
        pytest.skip(f"the service runs bwrap sandboxes: {BWRAP_REASON}")
    svc = Service("--idle-ttl", "60")
    yield svc
    svc.stop()


@pytest.fixture
def start_service() -> Any:
    """Start a private service with extra CLI arguments; stopped after the test."""
    if not HAS_BWRAP:
        pytest.skip(f"the service runs bwrap sandboxes: {BWRAP_REASON}")
    started = []

    def start(*extra: str) -> Service:
        started.append(Service(*extra))
        return started[-1]

    yield start
    for svc in started:
        if svc.proc.poll() is None:
            svc.stop()


def _wait_healthy(url: str, token: str) -> None:
    import time

    import httpx

    for _ in range(100):
        try:
            if httpx.get(f"{url}/health", headers={"Authorization": f"Bearer {token}"}).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError("sandbox service never became healthy")


@pytest.fixture(params=["bwrap", "remote"])
def hostile(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """Build an unstarted sandbox for hostile code: local bwrap, or remote -> service -> bwrap."""
    if not HAS_BWRAP:
        pytest.skip(BWRAP_REASON)
    if request.param == "remote":
        svc = request.getfixturevalue("service")

        def make(params: dict | None = None, **kwargs: Any) -> Any:
            return sandbox_class("remote")({**(params or {}), "url": svc.url, "token": svc.token}, **kwargs)
    else:
        def make(params: dict | None = None, **kwargs: Any) -> Any:
            return sandbox_class("bwrap")(params, **kwargs)
    make.backend = request.param
    return make
