"""OpenEnv servers: which environments are installed, starting one as a local process, and
one episode's WebSocket session.

An installed OpenEnv environment is a distribution named ``openenv-<module>`` whose module
ships ``openenv.yaml`` with ``app: server.app:app`` (the layout ``openenv init`` writes and
OpenEnv's own discovery reads; github.com/meta-pytorch/OpenEnv). It is served here with uvicorn
on a free loopback port, as a child process that dies with this one (``PR_SET_PDEATHSIG``).

An episode is one WebSocket session on ``/ws`` (the server keeps one environment per
connection; its HTTP ``/reset`` and ``/step`` keep no state between calls), with frames
``{"type": "reset" | "step" | "close", "data": ...}`` answered by ``{"type": "observation",
"data": {"observation", "reward", "done"}}`` or ``{"type": "error", "data": {"message",
"code", ...}}``. A step the server refuses as invalid for the action type
(``VALIDATION_ERROR``) is ``InvalidAction`` carrying pydantic's errors; any other error fails
the episode.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loongsage_agents.environments.server_process import ServerProcess, free_port

PREFIX = "openenv-"


class InvalidAction(ValueError):
    """A reply that is no valid action; its message is what the policy is told."""


def installed_environments() -> list[str]:
    """The installed OpenEnv environments' names: the modules of the distributions named
    ``openenv-<module>`` whose module holds ``openenv.yaml`` (found, not imported)."""
    found = set()
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        if not name.startswith(PREFIX) or name == "openenv-core":
            continue
        module = name[len(PREFIX):].replace("-", "_")
        if manifest_path(module) is not None:
            found.add(module)
    return sorted(found)


def manifest_path(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / "openenv.yaml").is_file():
            return Path(location) / "openenv.yaml"
    return None


def app_of(module: str) -> str:
    """The ``module:attribute`` of an installed environment's FastAPI app (its manifest's ``app``)."""
    import yaml

    path = manifest_path(module)
    manifest = yaml.safe_load(path.read_text()) if path else None
    app = (manifest or {}).get("app", "server.app:app")
    return f"{module}.{app}"


class LocalServer(ServerProcess):
    """An installed OpenEnv environment served by uvicorn on loopback, stopped at exit.

    Started from the event loop's thread (``PR_SET_PDEATHSIG`` follows the thread that forked,
    which must outlive the server); ``wait_healthy`` blocks, so it runs in a worker thread."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__([sys.executable, "-m", "uvicorn", app_of(module), "--host", "127.0.0.1",
                          "--port", str(self.port), "--log-level", "warning"], f"openenv-{module}-")

    def wait_healthy(self, timeout: float) -> None:
        import httpx

        module = self.module
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the OpenEnv server of {module!r} exited with {self.proc.returncode}: "
                                   f"{self.output()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        output = self.output()
        self.stop()
        raise RuntimeError(f"the OpenEnv server of {module!r} did not answer {self.url}/health within "
                           f"{timeout:g} s (server_start_timeout_s): {output[-2000:]}")


def action_schema(base_url: str) -> dict[str, Any]:
    """The JSON schema of the server's action type (``GET /schema``)."""
    import httpx

    reply = httpx.get(f"{base_url.rstrip('/')}/schema", timeout=30.0)
    reply.raise_for_status()
    return reply.json()["action"]


@dataclass
class StepResult:
    observation: dict[str, Any]
    reward: float | None
    done: bool


def validation_message(errors: list[dict[str, Any]]) -> str:
    """pydantic's errors of a refused action as one line: ``field: problem; ...``."""
    parts = []
    for error in errors:
        where = ".".join(str(p) for p in error.get("loc", ())) or "action"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(parts) or "the action does not match the schema"


class EnvSession:
    """One episode's WebSocket session (``async with``): ``reset(**kwargs)``, ``step(action)``."""

    def __init__(self, base_url: str, timeout_s: float) -> None:
        ws = base_url.rstrip("/").replace("http://", "ws://", 1).replace("https://", "wss://", 1)
        self.ws_url = f"{ws}/ws"
        self.timeout_s = timeout_s
        self.ws: Any = None

    async def __aenter__(self) -> "EnvSession":
        from websockets.asyncio.client import connect

        # close_timeout: a server still busy with a step that timed out never answers the close
        self.ws = await connect(self.ws_url, open_timeout=self.timeout_s, max_size=None, close_timeout=1.0)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.ws.send(json.dumps({"type": "close"}))
        except Exception:  # noqa: BLE001 - the server may already have closed the session
            pass
        await self.ws.close()

    async def _call(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        await self.ws.send(json.dumps({"type": kind, "data": data}))
        try:
            reply = json.loads(await asyncio.wait_for(self.ws.recv(), self.timeout_s))
        except asyncio.TimeoutError:  # not the episode's own deadline: say which one ran out
            raise RuntimeError(f"the OpenEnv server did not answer {kind} within {self.timeout_s:g} s "
                               "(step_timeout_s)") from None
        if reply.get("type") != "error":
            return reply.get("data", {})
        error = reply.get("data", {})
        if kind == "step" and error.get("code") == "VALIDATION_ERROR":
            raise InvalidAction(validation_message(error.get("errors", [])))
        raise RuntimeError(f"the OpenEnv server refused {kind}: {error.get('message')} ({error.get('code')})")

    async def reset(self, **kwargs: Any) -> StepResult:
        return self._result(await self._call("reset", kwargs))

    async def step(self, action: dict[str, Any]) -> StepResult:
        return self._result(await self._call("step", action))

    @staticmethod
    def _result(data: dict[str, Any]) -> StepResult:
        reward = data.get("reward")
        return StepResult(data.get("observation", {}), None if reward is None else float(reward),
                          bool(data.get("done", False)))
