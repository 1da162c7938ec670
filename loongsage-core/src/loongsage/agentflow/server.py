"""The AgentFlow router: an ASGI app on loopback that any agent can call unmodified.

Routes (each ``/v1/...`` also under a ``/{trajectory_id}/{attempt_id}`` prefix):
``HEAD|GET /`` (Claude Code probes it), ``GET /v1/models``, ``POST /v1/chat/completions``,
``POST /v1/responses``, ``POST /v1/messages`` (``?beta=true`` accepted),
``GET /v1/trajectories`` (a listing), ``GET /v1/trajectories/{trajectory_id}``,
``GET /health`` and vLLM's token-in ``POST /inference/v1/generate`` (prime-rl's and verifiers'
training client; ``protocols/token_generate.py``). A request's trajectory comes
from the path prefix, else from the API key (``Authorization: Bearer`` or ``x-api-key``)
read as ``"{trajectory_id}:{attempt_id}"`` or ``"{trajectory_id}"`` (attempt ``"0"``). With
``settings.session_header`` (``loongsage serve --session-header x-session-id``), a request
carrying that header goes to trajectory ``"{trajectory_id}.{session}"`` instead, so a client
that sends every rollout with one key and a session id per rollout (verifiers' ``vf-eval``)
records one trajectory per rollout.
Every error is answered in the caller's wire format. Binding a non-loopback address needs
an API key, with which agents name trajectories by issued tokens, and bodies are capped
(``access.py``).

Unlike baidu-baige/LoongSage (a reverse proxy in a daemon thread with emulated streaming), streaming
here relays the engine's own token stream as it is generated.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from loongsage.agentflow.access import TrajectoryTokens, capped_body, router_api_key
from loongsage.agentflow.errors import EngineError, RequestError
from loongsage.agentflow.middleware import RouterMiddleware, ToolCallParserMiddleware, TurnContext
from loongsage.agentflow.middleware_params import ToolCallParserParams
from loongsage.agentflow.protocols import ADAPTERS
from loongsage.agentflow.protocols.base import WireAdapter, sse
from loongsage.agentflow.protocols.token_generate import ROUTE as TOKEN_ROUTE, TokenGenerateAdapter
from loongsage.agentflow.settings import RouterSettings
from loongsage.agentflow.store import Trajectory, TrajectoryStore
from loongsage.agentflow.tito import ChatRenderer
from loongsage.agentflow.turns import TurnRunner
from loongsage.data.types import Sample
from loongsage.engines.pool import EnginePool
from loongsage.schema import PARSER_MIDDLEWARE

TOKEN_ADAPTER = TokenGenerateAdapter()
SESSION_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")  # what a session header may name


def build_middlewares(settings: RouterSettings) -> list[RouterMiddleware]:
    """The chain of ``settings.middlewares`` (resolved by config validation), each built as
    ``factory(settings, params)``, with the parser middleware last unless listed."""
    chain = [ref.obj(settings, ref.params) for ref in settings.middlewares]
    if all(ref.name != PARSER_MIDDLEWARE for ref in settings.middlewares):
        chain.append(ToolCallParserMiddleware(settings, ToolCallParserParams()))
    return chain


class Router:
    """Router state (store, engines, renderer) and its FastAPI app; ``start()`` serves it.

    ``engines`` is a list of engine clients or the run's ``EnginePool`` (shared with the
    rollout manager, so the run balances its engines in one place); ``settings`` carry the
    middlewares and the tool parser as config validation resolved them.
    """

    def __init__(self, engines: EnginePool | list[Any], tokenizer: Any,
                 settings: RouterSettings | None = None) -> None:
        self.settings = settings or RouterSettings()
        self.tokens = TrajectoryTokens(router_api_key(self.settings.api_key, self.settings.host))
        self.store = TrajectoryStore(self.settings.run_dir,
                                     auto_create=self.settings.auto_create_trajectories)
        self.pool = engines if isinstance(engines, EnginePool) else \
            EnginePool(list(engines), self.settings.max_inflight_per_engine)
        self.renderer = ChatRenderer(tokenizer)
        max_context = self.settings.max_context
        if max_context is None:
            limit = getattr(tokenizer, "model_max_length", None)
            max_context = int(limit) if isinstance(limit, int) and limit < 10**8 else None
        self.runner = TurnRunner(self.renderer, self.pool, build_middlewares(self.settings),
                                 self.settings.default_max_tokens, max_context,
                                 self.settings.clamp_max_tokens)
        self.app = self._build_app()
        self.url: str | None = None
        self._server = None  # a ThreadedServer once started

    # ---- trajectories -------------------------------------------------------------------
    def open_trajectory(self, trajectory_id: str, attempt_id: str = "0",
                        sampling: dict[str, Any] | None = None, **metadata: Any) -> Trajectory:
        """Open a trajectory; with ``sampling`` its trained turns sample with those parameters
        (temperature, top_p, top_k; max_new_tokens as a cap), whatever the client sends."""
        traj = self.store.open(trajectory_id, attempt_id, **metadata)
        traj.sampling = dict(sampling) if sampling else None
        if self.tokens.required:
            self.tokens.issue(trajectory_id, attempt_id)
        return traj

    def trajectory_key(self, trajectory_id: str, attempt_id: str = "0") -> str:
        """The API key an agent passes for this trajectory (its token on an exposed router)."""
        return f"{self.tokens.public_id(trajectory_id, attempt_id)}:{attempt_id}"

    def base_urls(self, trajectory_id: str, attempt_id: str = "0") -> dict[str, str]:
        """What to give an agent: ``OPENAI_BASE_URL`` (ends in /v1) and ``ANTHROPIC_BASE_URL``."""
        if self.url is None:
            raise RuntimeError("router is not started")
        root = f"{self.url}/{self.tokens.public_id(trajectory_id, attempt_id)}/{attempt_id}"
        return {"openai": f"{root}/v1", "anthropic": root}

    def finish_trajectory(self, trajectory_id: str, attempt_id: str = "0",
                          reward: float | None = None, error: str | None = None) -> list[Sample]:
        """Close a trajectory and return its training samples (one per trainable segment);
        with ``error`` it is persisted as failed, for that reason."""
        key = (str(trajectory_id), str(attempt_id))
        self.pool.release(key)
        self.runner.forget(key)
        self.tokens.revoke(*key)
        return self.store.finish(trajectory_id, attempt_id, reward=reward, error=error)

    def record_reward(self, sample: Sample) -> None:
        """Persist a scored sample's reward beside its trajectory (one row per trajectory)."""
        info = sample.reward_info
        self.store.record_reward(info["trajectory_id"], info.get("attempt_id", "0"), sample.reward, info)

    def _trajectory(self, http: Request, tid: str | None, aid: str | None) -> Trajectory:
        auth = http.headers.get("authorization", "")
        key = http.headers.get("x-api-key", "")
        if auth.lower().startswith("bearer "):
            key = auth[7:].strip()
        trusted = self.tokens.is_router_key(key)  # the operator: names trajectories by id
        if tid is None and trusted:
            tid, aid = "default", "0"
        if tid is None:
            if not key:
                raise RequestError("no trajectory key: call /{trajectory_id}/{attempt_id}/v1/... "
                                   "or pass "
                                   "'{trajectory_id}:{attempt_id}' as the API key", status=401,
                                   kind="authentication_error")
            tid, _, aid = key.partition(":")
        tid, aid = self.tokens.resolve(tid, aid or "0", trusted)
        tid = self._session_trajectory(http, tid)
        traj = self.store.lookup(tid, aid)
        if traj is None:
            raise RequestError(f"unknown trajectory {tid!r} attempt {aid or '0'!r}; open it first",
                               status=404, kind="not_found_error")
        return traj

    def _session_trajectory(self, http: Request, tid: str) -> str:
        """``tid``, or ``"{tid}.{session}"`` for a request carrying ``settings.session_header``."""
        header = self.settings.session_header
        session = http.headers.get(header) if header else None
        if session is None:
            return tid
        if not SESSION_ID.fullmatch(session):
            raise RequestError(f"header {header}: expected 1 to 128 of A-Z a-z 0-9 . _ -, got {session!r}",
                               status=400, param=header)
        return f"{tid}.{session}"

    def _check_model(self, model: str) -> None:
        served = self.settings.served_model_names + self.settings.untrained_models
        if not self.settings.accept_any_model and model not in served:
            raise RequestError(f"model: unknown model {model!r}; this router serves "
                               f"{served}", status=404, kind="model_not_found",
                               param="model")

    # ---- HTTP -----------------------------------------------------------------------------
    async def _count_tokens(self, http: Request) -> Response:
        """Anthropic's ``/v1/messages/count_tokens``: the rendering's length (stores nothing)."""
        adapter = ADAPTERS["messages"]
        try:
            body = await self._json(http)
            if isinstance(body, dict):
                body = {"max_tokens": 1, **body}
            request = adapter.parse_request(body)
            text = self.renderer.render(request.messages, request.tools, True)
        except RequestError as err:
            return JSONResponse(adapter.render_error(err), status_code=err.status)
        return JSONResponse({"input_tokens": len(self.renderer.encode(text))})

    async def _json(self, http: Request) -> Any:
        raw = await capped_body(http, self.settings.max_body_bytes, self.settings.body_timeout_s)
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise RequestError(f"malformed JSON body: {exc}") from None

    async def _handle(self, api: str, http: Request, tid: str | None, aid: str | None) -> Response:
        if api == "messages/count_tokens":
            return await self._count_tokens(http)
        adapter: WireAdapter | None = ADAPTERS.get(api)
        if adapter is None:
            served = sorted("/v1/" + k for k in ADAPTERS)
            err = RequestError(f"unknown endpoint /v1/{api}; served: {served}",
                               status=404, kind="not_found_error")
            return JSONResponse(ADAPTERS["chat/completions"].render_error(err), status_code=404)
        return await self._serve(adapter, http, tid, aid)

    async def _serve(self, adapter: WireAdapter, http: Request, tid: str | None,
                     aid: str | None) -> Response:
        try:
            request = adapter.parse_request(await self._json(http))
            self._check_model(request.model)
            traj = self._trajectory(http, tid, aid)
            headers = {k.lower(): v for k, v in http.headers.items()}
            trainable = request.model not in self.settings.untrained_models
            ctx = TurnContext(request=request, headers=headers, trajectory=traj,
                              trainable=trainable)
            turn = await self.runner.prepare(ctx)
        except RequestError as err:
            return JSONResponse(adapter.render_error(err), status_code=err.status)
        if request.stream:
            return StreamingResponse(self._sse(adapter, turn), media_type="text/event-stream",
                                     headers={"cache-control": "no-cache"},
                                     background=BackgroundTask(self.runner.abandon, turn))
        try:
            result = None
            async for ev in self.runner.events(turn, stream=False):
                result = ev.result or result
        except EngineError as err:
            failure = RequestError(str(err), status=500, kind="api_error")
            return JSONResponse(adapter.render_error(failure), status_code=500)
        return JSONResponse(adapter.render_response(request, result))

    async def _sse(self, adapter: WireAdapter, turn: Any):
        events = self.runner.events(turn, stream=True)
        try:
            async for chunk in adapter.stream_response(turn.ctx.request, events):
                yield chunk
        except EngineError as err:
            failure = RequestError(str(err), status=500, kind="api_error")
            yield sse(adapter.render_error(failure), event="error")
        finally:
            await events.aclose()

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="LoongSage AgentFlow router")

        @app.get("/health")
        async def health() -> dict[str, str]:
            return {"status": "ok"}

        context = {} if self.runner.max_context is None else {"max_model_len": self.runner.max_context}

        async def models() -> dict[str, Any]:
            return {"object": "list",
                    "data": [{"id": m, "object": "model", "created": 0, "owned_by": "loongsage", **context}
                             for m in self.settings.served_model_names]}

        app.get("/v1/models")(models)
        app.get("/{tid}/{aid}/v1/models")(models)

        @app.get("/v1/trajectories")
        async def trajectories(http: Request) -> Response:
            try:
                self.tokens.check_reader(http.headers.get("authorization", ""))
            except RequestError as err:
                return JSONResponse(ADAPTERS["chat/completions"].render_error(err), status_code=err.status)
            return JSONResponse({"trajectories": [
                {"trajectory_id": t.trajectory_id, "attempt_id": t.attempt_id, "status": t.status,
                 "num_tokens": len(t.tokens), "num_segments": len(t.segments)}
                for t in self.store]})

        @app.get("/v1/trajectories/{trajectory_id}")
        async def trajectory(trajectory_id: str, http: Request) -> Response:
            try:
                self.tokens.check_reader(http.headers.get("authorization", ""))
            except RequestError as err:
                return JSONResponse(ADAPTERS["chat/completions"].render_error(err), status_code=err.status)
            attempts = self.store.attempts(trajectory_id)
            if not attempts:
                return JSONResponse({"error": {"message": f"unknown trajectory {trajectory_id!r}",
                                               "type": "not_found_error"}}, status_code=404)
            return JSONResponse({"trajectory_id": trajectory_id,
                                 "attempts": [t.to_json() for t in attempts]})

        # the per-turn routes are plain Starlette routes: FastAPI's dependency solving and
        # path-parameter validation (all strings here) cost CPU on every turn for nothing
        async def api_call(http: Request) -> Response:
            params = http.path_params
            return await self._handle(params["api"], http, params.get("tid"), params.get("aid"))

        async def token_call(http: Request) -> Response:
            params = http.path_params
            return await self._serve(TOKEN_ADAPTER, http, params.get("tid"), params.get("aid"))

        app.add_route("/v1/{api:path}", api_call, methods=["POST"])
        app.add_route("/{tid}/{aid}/v1/{api:path}", api_call, methods=["POST"])
        app.add_route(TOKEN_ROUTE, token_call, methods=["POST"])
        app.add_route("/{tid}/{aid}" + TOKEN_ROUTE, token_call, methods=["POST"])

        # last: the catch-all prefix routes must not shadow /v1/... above
        @app.api_route("/", methods=["GET", "HEAD"])
        @app.api_route("/{tid}/{aid}", methods=["GET", "HEAD"])
        @app.api_route("/{tid}/{aid}/", methods=["GET", "HEAD"])
        async def root(tid: str | None = None, aid: str | None = None) -> dict[str, str]:
            return {"service": "loongsage-agentflow"}

        return app

    # ---- serving --------------------------------------------------------------------------
    def start(self) -> str:
        """Serve on ``settings.host:port`` in a background thread; returns the base URL."""
        from loongsage.http_thread import ThreadedServer, header_timeout_protocol

        self._server = ThreadedServer(self.app, self.settings.host, self.settings.port, name="agentflow-router",
                                      lifespan="off", http=header_timeout_protocol(self.settings.header_timeout_s))
        self.url = self._server.start()
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
        self._server = None

