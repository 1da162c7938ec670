"""The FastAPI app: SGLang's HTTP endpoints over an :class:`EmbeddedRolloutEngine`.

Wire format follows SGLang (SGLang's native API: sgl-project/sglang, docs/basic_usage/native_api):
``/generate`` answers
``{"text", "output_ids", "meta_info"}`` with ``meta_info.output_token_logprobs`` as
``[[logprob, token_id, null], ...]``, ``finish_reason`` ``{"type": "stop"|"length"|"abort", ...}``
and ``weight_version`` (a string); streaming answers ``text/event-stream`` lines
``data: {json}`` (cumulative, SGLang's default) ending with ``data: [DONE]``. Errors are
HTTP 400 with ``{"error": {"message": ..., "field": ...}}``. One addition to SGLang's
``meta_info``: ``output_token_weight_versions``, the weight version that sampled each token.
On an MoE model a request with ``return_routed_experts`` gets ``meta_info.routed_experts``: as
SGLang, base64 of little-endian int32 ``[prompt + output tokens - 1, layers, top_k]`` (every
token the model consumed), plus our ``routed_experts_shape`` ``[layers, top_k]``.

``/update_weights_from_tensor`` reads SGLang's own payloads (``load_format`` None or
"direct": ``ForkingPickler`` handles to the sender's shared memory,
``loongsage.engines.sglang.tensor_receiver``; held per ``weight_version`` until the request with
``flush_cache=True``, then applied at once) and ``load_format="loongsage_torch_b64"`` ones
(``weights_codec``: the bytes inline, applied per request). A weight update clears the prefix
cache unless the engine keeps it on updates (``scheduler``), and running requests always
recompute their KV under new weights. ``meta_info.cached_tokens`` is, as in SGLang, how many of
the request's prompt tokens its prefill took from the prefix cache (or from an identical prompt
of the same batch) rather than computing them. ``/get_server_info`` counts the weight
update requests per endpoint (``weight_update_requests``). ``/pause_generation``
without a body uses SGLang's default mode, ``abort``; ``EngineClient`` sends ``in_place``.

``/init_weights_update_group``, ``/update_weights_from_distributed`` and
``/destroy_weights_update_group`` follow SGLang's bodies
(``loongsage.engines.sglang.distributed_receiver``); unlike SGLang, the requests of one weight version are buffered and applied together on the one
with ``flush_cache=True``, so a multi-bucket update is atomic.

A non-streaming request whose client disconnects is aborted (checked every second), as
SGLang does, so abandoned requests do not keep decoding. A client that goes away before its
body has arrived (a cancelled request at shutdown) is answered 499 and never reaches the
engine, without a traceback.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import torch
from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect
from starlette.concurrency import run_in_threadpool

from loongsage.engines.embedded_rollout.params import RequestError, parse_generate
from loongsage.engines.embedded_rollout.scheduler import Request
from loongsage.engines.embedded_rollout.weights_codec import LOAD_FORMAT, decode_named_tensors
from loongsage.engines.sglang.distributed_receiver import (
    DistributedWeightUpdates,
    UpdateRequestError,
    request_version,
)
from loongsage.engines.sglang.tensor_receiver import TensorWeightUpdates

if TYPE_CHECKING:
    from loongsage.engines.embedded_rollout.engine import EmbeddedRolloutEngine

_PAUSE_MODES = ("abort", "in_place", "retract")
WEIGHT_UPDATE_PATHS = ("/update_weights_from_tensor", "/init_weights_update_group",
                       "/update_weights_from_distributed", "/destroy_weights_update_group")


def _error(field: str, message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "field": field}}, status_code=status)


async def _json_body(http: HTTPRequest, required: bool) -> dict[str, Any]:
    raw = await http.body()
    if not raw.strip():
        if required:
            raise RequestError("body", "expected a JSON object, got an empty body")
        return {}
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise RequestError("body", f"invalid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise RequestError("body", "expected a JSON object")
    return body


def build_app(engine: "EmbeddedRolloutEngine") -> FastAPI:
    app = FastAPI(title="LoongSage embedded rollout engine")
    sched = engine.scheduler
    tok = engine.tokenizer

    @app.exception_handler(RequestError)
    async def _bad_request(_: HTTPRequest, exc: RequestError) -> JSONResponse:
        return _error(exc.field, str(exc))

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(_: HTTPRequest, __: ClientDisconnect) -> Response:
        return Response(status_code=499)

    def routes_meta(req: Request) -> dict[str, Any]:
        routes = torch.cat(req.routes) if req.routes else torch.zeros(0, *sched.routers.shape)
        fed = len(req.prompt_ids) + len(req.output_ids) - 1
        raw = routes[:fed].to(torch.int32).numpy().astype("<i4").tobytes()
        return {"routed_experts": base64.b64encode(raw).decode("ascii"),
                "routed_experts_shape": list(sched.routers.shape)}

    def render(req: Request, return_logprob: bool, return_routes: bool = False) -> dict[str, Any]:
        done = req.done
        n = len(req.versions)
        ids = req.output_ids[:n]
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": req.finish if done else None,
            "prompt_tokens": len(req.prompt_ids),
            "completion_tokens": n,
            "cached_tokens": req.cached_tokens or 0,
            "weight_version": str(sched.version),
            "output_token_weight_versions": req.versions[:n],
            "e2e_latency": time.monotonic() - req.created,
        }
        if return_logprob:
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(req.logprobs[:n], ids)]
        if return_routes and done:
            meta.update(routes_meta(req))
        text = tok.decode(ids, skip_special_tokens=req.params.skip_special_tokens) if tok else ""
        return {"text": text, "output_ids": ids, "meta_info": meta}

    def track(req_parsed, loop: asyncio.AbstractEventLoop) -> tuple[Request, asyncio.Event]:
        event = asyncio.Event()
        req = Request(
            rid=req_parsed.rid or uuid.uuid4().hex,
            prompt_ids=req_parsed.input_ids,
            params=req_parsed.params,
            on_update=lambda n, done: loop.call_soon_threadsafe(event.set),
            stream=req_parsed.stream,
        )
        return req, event

    async def wait_done(http: HTTPRequest, tracked: list[tuple[Request, asyncio.Event]]) -> None:
        """Until every request of the body is done; a client gone aborts all that still run."""
        for req, event in tracked:
            while not req.done:
                try:
                    await asyncio.wait_for(event.wait(), timeout=1.0)
                except asyncio.TimeoutError:
                    running = [other.rid for other, _ in tracked if not other.done]
                    if running and await http.is_disconnected():
                        await asyncio.wrap_future(sched.abort(*running))
                event.clear()

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(http: HTTPRequest):
        body = await _json_body(http, required=True)
        tokenize = (lambda t: tok(t)["input_ids"]) if tok is not None else None
        parsed, batched = parse_generate(body, engine.vocab_size, tokenize)
        if any(p.return_routed_experts for p in parsed) and not sched.routers.is_moe:
            raise RequestError("return_routed_experts", f"{engine.model_path} is a dense model: "
                               "it has no MoE router layers to report")
        for i, p in enumerate(parsed):
            if len(p.input_ids) >= engine.max_len:
                raise RequestError("input_ids", f"prompt {i} has {len(p.input_ids)} tokens; the "
                                   f"model's context is {engine.max_len}")
        loop = asyncio.get_running_loop()
        tracked = [track(p, loop) for p in parsed]
        sched.submit(*(req for req, _ in tracked))
        if parsed[0].stream:
            req, event = tracked[0]
            return StreamingResponse(stream(req, event, parsed[0].return_logprob,
                                            parsed[0].return_routed_experts),
                                     media_type="text/event-stream")
        await wait_done(http, tracked)
        outs = [render(req, p.return_logprob, p.return_routed_experts)
                for (req, _), p in zip(tracked, parsed)]
        return outs if batched else outs[0]

    async def stream(req: Request, event: asyncio.Event, return_logprob: bool, return_routes: bool):
        sent = -1
        try:
            while True:
                await event.wait()
                event.clear()
                done, n = req.done, len(req.versions)
                if n > sent or done:
                    sent = n
                    chunk = render(req, return_logprob, return_routes)
                    yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
                if done:
                    break
            yield b"data: [DONE]\n\n"
        finally:
            if not req.done:  # the client went away mid-stream
                sched.abort(req.rid)

    @app.post("/abort_request")
    async def abort_request(http: HTTPRequest):
        body = await _json_body(http, required=True)
        if body.get("abort_all"):
            return {"aborted": await asyncio.wrap_future(sched.abort(None))}
        rid = body.get("rid")
        if not isinstance(rid, str) or not rid:
            raise RequestError("rid", "expected the rid of the request to abort (or abort_all)")
        return {"aborted": await asyncio.wrap_future(sched.abort(rid))}

    @app.post("/pause_generation")
    async def pause_generation(http: HTTPRequest):
        body = await _json_body(http, required=False)
        mode = body.get("mode", "abort")
        if mode not in _PAUSE_MODES:
            raise RequestError("mode", f"expected one of {list(_PAUSE_MODES)}, got {mode!r}")
        await asyncio.wrap_future(sched.pause(mode))
        return {"success": True, "mode": mode}

    @app.post("/continue_generation")
    async def continue_generation(http: HTTPRequest):
        await _json_body(http, required=False)
        await asyncio.wrap_future(sched.resume())
        return {"success": True}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        if await asyncio.wrap_future(sched.flush_cache()):
            return {"success": True, "message": "Cache flushed."}
        return JSONResponse({"success": False, "message": "Cannot flush cache: requests are "
                             "running or waiting.", "error": {"message": "requests in flight",
                                                              "field": "flush_cache"}},
                            status_code=400)

    shapes = {n: tuple(t.shape) for n, t in engine.model.state_dict().items()}
    updates = DistributedWeightUpdates(engine.apply_weights, shapes,
                                       device=next(engine.model.parameters()).device)
    tensor_updates = TensorWeightUpdates(engine.apply_weights, shapes)
    seen = {path: 0 for path in WEIGHT_UPDATE_PATHS}

    def codec_update(body: dict[str, Any]) -> dict[str, Any]:
        """The CPU codec's payload (``weights_codec``): the tensors' bytes inline."""
        entries = body.get("serialized_named_tensors")
        if not isinstance(entries, list) or not entries or not all(isinstance(e, str) for e in entries):
            raise UpdateRequestError("serialized_named_tensors", "expected a non-empty list of strings")
        version = request_version(body)
        try:
            named = [nt for e in entries for nt in decode_named_tensors(e)]
        except ValueError as exc:
            raise UpdateRequestError("serialized_named_tensors", str(exc)) from exc
        try:
            new = engine.apply_weights(named, version)
        except (KeyError, ValueError) as exc:
            raise UpdateRequestError("serialized_named_tensors", exc.args[0] if exc.args else str(exc)) from exc
        return {"success": True, "message": f"updated {len(named)} tensors", "weight_version": str(new)}

    def from_tensor(body: dict[str, Any]) -> dict[str, Any]:
        return (codec_update if body.get("load_format") == LOAD_FORMAT else tensor_updates.update)(body)

    async def weight_update(http: HTTPRequest, handler) -> JSONResponse | dict:
        body = await _json_body(http, required=True)
        seen[http.url.path] += 1
        if body.get("abort_all_requests"):
            await asyncio.wrap_future(sched.abort(None))
        try:
            return await run_in_threadpool(handler, body)
        except UpdateRequestError as exc:
            return JSONResponse({"success": False, "message": str(exc),
                                 "error": {"message": str(exc), "field": exc.field}},
                                status_code=400)
        except (KeyError, ValueError) as exc:  # apply_weights refused the version
            msg = exc.args[0] if exc.args else str(exc)
            return JSONResponse({"success": False, "message": msg,
                                 "error": {"message": msg, "field": "serialized_named_tensors"}},
                                status_code=400)

    @app.post("/update_weights_from_tensor")
    async def update_weights_from_tensor(http: HTTPRequest):
        return await weight_update(http, from_tensor)

    @app.post("/init_weights_update_group")
    async def init_weights_update_group(http: HTTPRequest):
        return await weight_update(http, updates.init_group)

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(http: HTTPRequest):
        return await weight_update(http, updates.update)

    @app.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(http: HTTPRequest):
        return await weight_update(http, updates.destroy)

    @app.get("/get_model_info")
    async def get_model_info():
        return engine.model_info()

    @app.get("/get_weight_version")
    async def get_weight_version():
        return {"weight_version": str(sched.version)}

    @app.get("/get_server_info")
    async def get_server_info():
        return {"version": "loongsage-embedded", "max_running_requests": sched.max_running,
                "paused": sched.paused, "weight_update_requests": dict(seen), **sched.load()}

    @app.get("/get_load")
    async def get_load():
        return sched.load()

    @app.api_route("/health", methods=["GET", "POST"])
    async def health():
        if not sched.alive:
            return JSONResponse({"status": "decode loop stopped"}, status_code=503)
        return {"status": "ok"}

    return app
