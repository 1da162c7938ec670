"""``EngineClient``: the one client every LoongSage component uses to talk to a rollout engine.

It speaks SGLang's native HTTP API (``/generate`` with token ids, ``/abort_request``,
``/pause_generation``, ``/continue_generation``, ``/flush_cache``,
``/update_weights_from_tensor``, ``/get_model_info``, ``/get_weight_version``,
``/health``), so the controller, the AgentFlow router and TransferMesh work unchanged
against a real SGLang server or LoongSage's embedded engine. Every call has a blocking form
(``generate``) and an asyncio form (``agenerate``); ``astream_generate`` yields incremental
chunks of a streaming generation.

Wire-format tolerance (SGLang fields vary by version; sgl-project/sglang's native API):
``output_ids`` are read from the top level when present, else from
``meta_info.output_token_logprobs`` (``[[logprob, token_id, text], ...]``); streaming chunks may be
cumulative (SGLang's default) or incremental (``--stream-output``) and are normalised to increments;
``weight_version`` strings that are decimal integers become ``int``. A client made with
``return_routed_experts=True`` asks every generation for its MoE routes (SGLang's
``return_routed_experts``) and gives them as ``GenerateOutput.routed_experts`` in the record
format of ``loongsage.engines.routing`` (aligned with prompt + output tokens). ``usage``
counts the prompt tokens of finished generations and the engine's ``cached_tokens`` among them
(``PromptUsage``: a step's prefix-cache metrics). Every request carries a ``rid`` (a fresh
UUID unless the caller gives one) so that it can be aborted.

The client holds one ``httpx.Client`` for blocking calls and, per event loop, ``POOL_SHARDS``
``httpx.AsyncClient``s taken in turn, so it is safe to share between threads and between
``asyncio.run`` calls. One pool per loop would hold a connection per concurrent request, and
httpcore's pool walks all of its connections at every request it assigns and every response it
releases (quadratic in the concurrency, encode/httpcore#1035): with 64 concurrent turns that
walk was about 40% of the AgentFlow router's CPU (``benchmarks/router.py``). Shards keep each
pool small (sixteen of them cost the router 1.3 ms of CPU per turn at 64 sessions where eight
cost 1.5-1.7 ms; ``docs/benchmarks.md``); the shards share one SSL context (building one costs
~0.1 s).

    client = EngineClient(url)                        # e.g. EmbeddedRolloutEngine(...).start()
    out = client.generate(ids, {"max_new_tokens": 64, "temperature": 1.0})
    out.output_ids, out.output_logprobs, out.finish_reason, out.weight_version
    client.pause_generation("in_place")               # keep in-flight requests
    client.update_weights_from_tensor(model.named_parameters(), weight_version=step)
    client.continue_generation()
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
import uuid
import weakref
from typing import Any, AsyncIterator, Iterable, Sequence

import httpx

from loongsage.engines.replies import (EngineError, GenerateOutput, StreamChunk, finish_of, generate_output,
                                        raise_for_error, routes_of, tokens_of, weight_version_of)


# One dict for every prompt of a request, or (a batch) a list of one dict per prompt.
SamplingParams = "dict[str, Any] | list[dict[str, Any]] | None"


def per_prompt(sampling_params: SamplingParams, index: int) -> dict[str, Any] | None:
    """The sampling parameters of a batch's ``index``-th prompt."""
    return sampling_params[index] if isinstance(sampling_params, list) else sampling_params


def batch_rids(prompts: Sequence[Sequence[int]], rids: Sequence[str] | None) -> list[str]:
    """One rid per prompt of a batch: the caller's (as many as the prompts) or fresh ones."""
    rids = list(rids) if rids is not None else [uuid.uuid4().hex for _ in prompts]
    if len(rids) != len(prompts):
        raise ValueError(f"agenerate_batch: {len(prompts)} prompts but {len(rids)} rids")
    return rids


# Idle connections are dropped after this many seconds, well before a server closes them
# (SGLang's uvicorn: 5 s; ours: http_thread.KEEP_ALIVE_S): reusing a connection the server is
# closing resets it, and the request fails unread (httpx's own default is also 5 s).
KEEPALIVE_EXPIRY_S = 2.0
POOL_SHARDS = 16  # async connection pools per event loop, taken in turn (module docstring)


class PromptUsage:
    """Prompt tokens sent in finished generations and how many the engine took from its prefix
    cache (``meta_info.cached_tokens``, SGLang's field, which the embedded engine fills the
    same way), since the last ``take``; safe to share between threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.prompt_tokens = self.cached_tokens = 0

    def note(self, meta: dict[str, Any]) -> None:
        with self._lock:
            self.prompt_tokens += int(meta.get("prompt_tokens") or 0)
            self.cached_tokens += int(meta.get("cached_tokens") or 0)

    def counted(self, out: GenerateOutput) -> GenerateOutput:
        self.note(out.meta_info)
        return out

    def take(self) -> tuple[int, int]:
        """``(prompt_tokens, cached_tokens)`` since the last call."""
        with self._lock:
            taken = (self.prompt_tokens, self.cached_tokens)
            self.prompt_tokens = self.cached_tokens = 0
        return taken


class EngineClient:
    """Client of one rollout engine (embedded or SGLang) at ``base_url``.

    ``timeout`` bounds every call in seconds (a generation included); ``None`` waits forever.
    """

    def __init__(self, base_url: str, timeout: float | None = 600.0,
                 return_routed_experts: bool = False):
        self.base_url = base_url.rstrip("/")
        self.return_routed_experts = return_routed_experts
        self.timeout = httpx.Timeout(timeout, connect=None if timeout is None else min(10.0, timeout))
        self.limits = httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S)
        self._client = httpx.Client(base_url=self.base_url, timeout=self.timeout, limits=self.limits)
        self._aclients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loop -> shards
        self._turn = itertools.count()
        self._ssl: Any = None
        self.usage = PromptUsage()

    def __repr__(self) -> str:
        return f"EngineClient({self.base_url!r})"

    # ---- plumbing ------------------------------------------------------------------------
    def _aclient(self) -> httpx.AsyncClient:
        """This loop's next connection pool (``POOL_SHARDS`` of them, taken in turn)."""
        loop = asyncio.get_running_loop()
        shards = self._aclients.get(loop)
        if shards is None:
            if self._ssl is None:
                self._ssl = httpx.create_ssl_context()
            shards = [httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout, limits=self.limits,
                                        verify=self._ssl) for _ in range(POOL_SHARDS)]
            self._aclients[loop] = shards
        return shards[next(self._turn) % len(shards)]

    def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        try:
            resp = self._client.request(method, path, json=body)
        except httpx.TransportError as exc:
            raise EngineError(path, f"{self.base_url}: {exc!r}") from exc
        raise_for_error(resp, path)
        return resp.json() if resp.content else None

    async def _acall(self, method: str, path: str, body: dict | None = None) -> Any:
        try:
            resp = await self._aclient().request(method, path, json=body)
        except httpx.TransportError as exc:
            raise EngineError(path, f"{self.base_url}: {exc!r}") from exc
        raise_for_error(resp, path)
        return resp.json() if resp.content else None

    def close(self) -> None:
        self._client.close()

    async def aclose(self) -> None:
        for client in self._aclients.pop(asyncio.get_running_loop(), []):
            await client.aclose()

    def __enter__(self) -> "EngineClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> "EngineClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    # ---- generation ----------------------------------------------------------------------
    def _generate_body(self, input_ids: Sequence[int] | list[list[int]], sampling_params: SamplingParams,
                       return_logprob: bool, rid: str | list[str] | None, stream: bool) -> dict[str, Any]:
        """A ``/generate`` body: one prompt and its rid, or (a batch) a list of each; a batch's
        ``sampling_params`` may be one per prompt (SGLang's batch form: each its own seed)."""
        body = {
            "input_ids": list(input_ids),
            "sampling_params": ([dict(p) for p in sampling_params] if isinstance(sampling_params, list)
                                else dict(sampling_params or {})),
            "return_logprob": return_logprob,
            "rid": rid or uuid.uuid4().hex,
            "stream": stream,
        }
        if self.return_routed_experts:
            body["return_routed_experts"] = True
        return body

    def generate(self, input_ids: Sequence[int], sampling_params: dict[str, Any] | None = None,
                 *, return_logprob: bool = True, rid: str | None = None) -> GenerateOutput:
        """Generate from token ids (no chat template is applied). Always set
        ``sampling_params["max_new_tokens"]``: SGLang's default is 16."""
        body = self._generate_body(input_ids, sampling_params, return_logprob, rid, False)
        return self.usage.counted(generate_output(self._call("POST", "/generate", body), body["rid"]))

    async def agenerate(self, input_ids: Sequence[int],
                        sampling_params: dict[str, Any] | None = None, *,
                        return_logprob: bool = True, rid: str | None = None) -> GenerateOutput:
        """Asyncio form of :meth:`generate`."""
        body = self._generate_body(input_ids, sampling_params, return_logprob, rid, False)
        return self.usage.counted(generate_output(await self._acall("POST", "/generate", body), body["rid"]))

    async def agenerate_batch(self, prompts: Sequence[Sequence[int]],
                              sampling_params: SamplingParams = None, *,
                              return_logprob: bool = True,
                              rids: Sequence[str] | None = None) -> list[GenerateOutput]:
        """One ``/generate`` for several prompts (a list of ``input_ids``; SGLang's batch form),
        one output per prompt in order: the engine admits them together, so a group's copies
        of one prompt share a prefill."""
        rids = batch_rids(prompts, rids)
        if not prompts:
            return []
        body = self._generate_body([list(p) for p in prompts], sampling_params, return_logprob, rids, False)
        outs = await self._acall("POST", "/generate", body)
        if not isinstance(outs, list) or len(outs) != len(prompts):
            raise EngineError("/generate", f"a batch of {len(prompts)} prompts came back as "
                              f"{type(outs).__name__} of {len(outs) if isinstance(outs, list) else 1}", 200)
        return [self.usage.counted(generate_output(out, rid)) for out, rid in zip(outs, rids)]

    async def astream_generate(self, input_ids: Sequence[int],
                               sampling_params: dict[str, Any] | None = None, *,
                               return_logprob: bool = True,
                               rid: str | None = None) -> AsyncIterator[StreamChunk]:
        """Stream a generation; each chunk holds only the tokens new since the last one.

        Leaving the iteration early closes the connection, which aborts the request.
        """
        body = self._generate_body(input_ids, sampling_params, return_logprob, rid, True)
        seen_tokens, seen_text = 0, ""
        try:
            async with self._aclient().stream("POST", "/generate", json=body) as resp:
                if not resp.is_success:
                    await resp.aread()
                    raise_for_error(resp, "/generate")
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[len("data:"):].strip()
                    if payload == "[DONE]":
                        return
                    out = json.loads(payload)
                    if "error" in out:
                        err = out["error"]
                        raise EngineError("/generate", err.get("message", str(err))
                                          if isinstance(err, dict) else str(err))
                    meta = out.get("meta_info", {})
                    ids, logprobs = tokens_of(out, "/generate")
                    versions = meta.get("output_token_weight_versions")
                    total = int(meta.get("completion_tokens", len(ids)))
                    text = out.get("text") or ""
                    if len(ids) == total:  # cumulative chunk (SGLang's default)
                        ids = ids[seen_tokens:]
                        logprobs = logprobs[seen_tokens:] if logprobs is not None else None
                        versions = versions[seen_tokens:] if versions is not None else None
                        delta, seen_text = text[len(seen_text):], text
                    else:  # incremental chunk (--stream-output)
                        delta, seen_text = text, seen_text + text
                    seen_tokens = total
                    reason, _ = finish_of(meta)
                    routes = routes_of(meta, int(meta.get("prompt_tokens", 0)) + total)
                    if reason is not None:
                        self.usage.note(meta)
                    yield StreamChunk(ids, logprobs, delta, reason is not None, reason,
                                      weight_version_of(meta.get("weight_version")), body["rid"], routes,
                                      versions)
        except httpx.TransportError as exc:
            raise EngineError("/generate", f"{self.base_url}: {exc!r}") from exc

    # ---- control -------------------------------------------------------------------------
    def abort(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        """Abort request ``rid`` (or all with ``abort_all``); it finishes with ``abort`` and
        returns the tokens generated so far to its caller."""
        self._call("POST", "/abort_request", self._abort_body(rid, abort_all))

    async def aabort(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        await self._acall("POST", "/abort_request", self._abort_body(rid, abort_all))

    @staticmethod
    def _abort_body(rid: str | None, abort_all: bool) -> dict[str, Any]:
        if rid is None and not abort_all:
            raise ValueError("abort: give a rid or abort_all=True")
        return {"rid": rid or "", "abort_all": abort_all}

    def pause_generation(self, mode: str = "in_place") -> None:
        """Pause decoding. ``in_place`` keeps requests and their KV (the default here, unlike
        SGLang's server-side default ``abort``); ``retract`` keeps requests and recomputes
        KV on continue; ``abort`` finishes running requests with ``abort``."""
        self._call("POST", "/pause_generation", {"mode": mode})

    async def apause_generation(self, mode: str = "in_place") -> None:
        await self._acall("POST", "/pause_generation", {"mode": mode})

    def continue_generation(self) -> None:
        self._call("POST", "/continue_generation", {})

    async def acontinue_generation(self) -> None:
        await self._acall("POST", "/continue_generation", {})

    def flush_cache(self) -> bool:
        """Drop the engine's prefix cache; False when it refuses because requests are in flight."""
        try:
            self._call("POST", "/flush_cache")
        except EngineError as exc:
            if exc.status == 400:
                return False
            raise
        return True

    async def aflush_cache(self) -> bool:
        try:
            await self._acall("POST", "/flush_cache")
        except EngineError as exc:
            if exc.status == 400:
                return False
            raise
        return True

    def health(self) -> bool:
        """True when the engine answers ``/health`` with 200 (never raises)."""
        try:
            return self._client.get("/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    async def ahealth(self) -> bool:
        try:
            return (await self._aclient().get("/health", timeout=5.0)).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_until_healthy(self, timeout: float = 60.0, interval: float = 0.2) -> None:
        """Block until ``/health`` answers 200; raise :class:`EngineError` after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not self.health():
            if time.monotonic() > deadline:
                raise EngineError("/health", f"{self.base_url} not healthy after {timeout} s")
            time.sleep(interval)

    def get_model_info(self) -> dict[str, Any]:
        return self._call("GET", "/get_model_info")

    async def aget_model_info(self) -> dict[str, Any]:
        return await self._acall("GET", "/get_model_info")

    def get_weight_version(self) -> int | str | None:
        return weight_version_of(self._call("GET", "/get_weight_version").get("weight_version"))

    async def aget_weight_version(self) -> int | str | None:
        return weight_version_of((await self._acall("GET", "/get_weight_version")).get("weight_version"))

    # ---- weights -------------------------------------------------------------------------
    @staticmethod
    def _weights_body(named_tensors, serialized_named_tensors, load_format, weight_version,
                      flush_cache, abort_all_requests) -> dict[str, Any]:
        if (named_tensors is None) == (serialized_named_tensors is None):
            raise ValueError("update_weights_from_tensor: give exactly one of named_tensors "
                             "or serialized_named_tensors")
        if named_tensors is not None:
            from loongsage.engines.embedded_rollout.weights_codec import (
                LOAD_FORMAT, encode_named_tensors)

            serialized_named_tensors = [encode_named_tensors(named_tensors)]
            load_format = load_format or LOAD_FORMAT
        body = {"serialized_named_tensors": list(serialized_named_tensors),
                "load_format": load_format, "flush_cache": flush_cache,
                "abort_all_requests": abort_all_requests}
        if weight_version is not None:
            body["weight_version"] = str(weight_version)
        return body

    def update_weights_from_tensor(
        self, named_tensors: Iterable[tuple[str, Any]] | None = None, *,
        serialized_named_tensors: list[str] | None = None, load_format: str | None = None,
        weight_version: int | str | None = None, flush_cache: bool = True,
        abort_all_requests: bool = False,
    ) -> dict[str, Any]:
        """Load new weights. ``named_tensors`` (HF names, CPU or any device) are encoded for
        the embedded engine (``loongsage_torch_b64``); for SGLang pass
        ``serialized_named_tensors`` already serialized by the caller (one per TP rank, as
        SGLang's ``MultiprocessingSerializer`` produces) with its ``load_format``."""
        body = self._weights_body(named_tensors, serialized_named_tensors, load_format,
                                  weight_version, flush_cache, abort_all_requests)
        return self._checked(self._call("POST", "/update_weights_from_tensor", body))

    async def aupdate_weights_from_tensor(
        self, named_tensors: Iterable[tuple[str, Any]] | None = None, *,
        serialized_named_tensors: list[str] | None = None, load_format: str | None = None,
        weight_version: int | str | None = None, flush_cache: bool = True,
        abort_all_requests: bool = False,
    ) -> dict[str, Any]:
        body = self._weights_body(named_tensors, serialized_named_tensors, load_format,
                                  weight_version, flush_cache, abort_all_requests)
        return self._checked(await self._acall("POST", "/update_weights_from_tensor", body))

    @staticmethod
    def _checked(out: Any) -> dict[str, Any]:
        if isinstance(out, dict) and out.get("success") is False:
            raise EngineError("/update_weights_from_tensor", str(out.get("message")))
        return out if isinstance(out, dict) else {"success": True}
