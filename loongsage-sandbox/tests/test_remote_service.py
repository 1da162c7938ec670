"""The sandbox service and its ``remote`` client over real HTTP on loopback."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from loongsage.plugin import ConfigError
from loongsage.plugin.testing import installed_registries
from loongsage_sandbox.errors import SandboxError, SandboxUnavailableError
from loongsage_sandbox.testing import host_processes_with


def run(coro):
    return asyncio.run(coro)


def remote(service, params=None, **kwargs):
    return installed_registries().sandbox.get("remote")({"url": service.url, "token": service.token, **(params or {})}, **kwargs)


def _health(service):
    return httpx.get(f"{service.url}/health", headers={"Authorization": f"Bearer {service.token}"}).json()


def test_remote_roundtrip_limits_and_close(service):
    async def go():
        sb = remote(service, {"memory_mb": 128, "timeout_s": 5}, files={"a.py": "print(sum(range(10)))"})
        async with sb:
            held = _health(service)["sandboxes"]
            out = await sb.exec("python3 a.py")
            await sb.write_file("bin/data", b"\x00\xff" * 10)
            data = await sb.read_file("bin/data")
            listing = [(e.name, e.type) for e in await sb.list_files()]
            await sb.reset()
            after_reset = [e.name for e in await sb.list_files()]
            return sb.service_limits, held, out, data, listing, after_reset

    limits, held, out, data, listing, after_reset = run(go())
    assert limits["memory_mb"] == 128 and limits["timeout_s"] == 5  # lowered by the client
    assert limits["disk_mb"] == 64  # the service's own value where the client left the default
    assert held >= 1 and out.text == "45\n"
    assert data == b"\x00\xff" * 10
    assert listing == [("a.py", "file"), ("bin", "dir")]
    assert after_reset == ["a.py"]
    assert _health(service)["sandboxes"] == 0  # close deleted it on the service


def test_service_requires_the_token(service):
    raw = httpx.post(f"{service.url}/sandboxes", json={})
    assert raw.status_code == 401 and raw.json()["error"] == "unauthorized"
    wrong = httpx.get(f"{service.url}/health", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401

    async def go():
        async with remote(service, {"token": "wrong"}):
            pass

    with pytest.raises(SandboxUnavailableError, match="rejected the token"):
        run(go())


def test_clients_cannot_raise_limits_or_set_backend_fields(service):
    async def create(params):
        async with remote(service, params):
            pass

    with pytest.raises(ConfigError, match=r"sandbox\.memory_mb: 4096 exceeds the service's limit 512"):
        run(create({"memory_mb": 4096}))
    token = service.token
    raw = httpx.post(f"{service.url}/sandboxes", headers={"Authorization": f"Bearer {token}"},
                     json={"params": {"ro_binds": ["/root"]}})
    assert raw.status_code == 400
    assert raw.json()["message"].startswith("sandbox.ro_binds: not settable through the service")


def test_errors_keep_their_kind_over_the_wire(service):
    async def go():
        async with remote(service) as sb:
            with pytest.raises(SandboxError) as escape:
                await sb.read_file("../../etc/passwd")
            with pytest.raises(SandboxError) as missing:
                await sb.read_file("nope.txt")
            with pytest.raises(ConfigError, match=r"exec\.command"):
                await sb.exec([])
            return escape.value.kind, missing.value.kind

    assert run(go()) == ("path_escape", "not_found")


def test_remote_needs_a_token_and_a_reachable_service(monkeypatch):
    cls = installed_registries().sandbox.get("remote")
    monkeypatch.delenv("LOONGSAGE_SANDBOX_TOKEN", raising=False)
    with pytest.raises(ConfigError, match=r"sandbox\.token"):
        cls({"url": "http://127.0.0.1:9"})

    async def go():
        async with cls({"url": "http://127.0.0.1:9", "token": "t"}):
            pass

    with pytest.raises(SandboxUnavailableError, match="unreachable"):
        run(go())


def test_idle_sandboxes_expire_and_stopping_the_service_closes_the_rest(start_service):
    import time

    svc = start_service("--idle-ttl", "0.5")
    auth = {"Authorization": f"Bearer {svc.token}"}
    idle = httpx.post(f"{svc.url}/sandboxes", headers=auth, json={}).json()["id"]
    for _ in range(100):  # the reaper runs every idle-ttl seconds
        if _health(svc)["sandboxes"] == 0:
            break
        time.sleep(0.1)
    gone = httpx.post(f"{svc.url}/sandboxes/{idle}/exec", headers=auth, json={"argv": ["true"]})
    assert gone.status_code == 404 and gone.json()["error"] == "not_found"

    busy = httpx.post(f"{svc.url}/sandboxes", headers=auth, json={}).json()["id"]
    started = httpx.post(f"{svc.url}/sandboxes/{busy}/exec", headers=auth,
                         json={"argv": ["sh", "-c", "sleep 6543 >/dev/null 2>&1 &"]})
    assert started.status_code == 200 and len(host_processes_with("sleep 6543")) == 1
    svc.stop()  # SIGTERM: graceful shutdown closes every sandbox (bwrap's die-with-parent backs it up)
    assert host_processes_with("sleep 6543") == []
