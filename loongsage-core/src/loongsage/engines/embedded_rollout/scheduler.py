"""The decode loop: one thread that owns the model, the running batch and the waiting queue.

Every state change (a new request, an abort, pause/continue, a weight swap) is a command
executed by this thread *between* decode steps, so a step never sees a half-applied change
and no lock guards the model. One iteration of the loop:

1. run queued commands;
2. unless paused: if the weights changed while requests were running, move the running
   requests back to the queue (their KV was computed with the old weights; SGLang's
   "retract"), then admit waiting requests up to ``max_running`` (one batched prefill of
   prompt + tokens generated so far, which also samples their next token; with a prefix
   cache, ``prefix_cache``, only of the tokens past each one's longest cached prefix), then
   one decode step over every running row;
3. finished rows (stop token, EOS, ``max_new_tokens``, context limit) leave the batch and
   their callers are notified; streaming callers are notified after every step.

The prefix cache receives every admitted request's tokens after its prefill and every leaving
row's (finished or aborted: a partial rollout continues from it) tokens fed so far, with their
KV and MoE routes. It is cleared when the weights change (the KV was computed by the old ones)
unless ``keep_prefix_cache_on_update``: then a request continues on KV of older weights, as
SkyRL and NeMo-RL allow, and the mismatch shows in the train/rollout log-prob gap
(``train/is_approx_k3_kl``). A weight loss, ``/flush_cache`` and an offload clear it too.

Each row samples with its own uniform, a function of its request's seed and the token's position
in the sequence (``engines.sampling_seed``): the client's ``sampling_seed``, else one derived from
the engine's seed and the request's rid. What a request samples therefore depends on neither the
batch it shares nor the engine's history (one generator per engine made it depend on both).

Each sampled token is tagged with the weight version that produced it, so a partial rollout
that spans an update knows which tokens came from which policy. On an MoE model every forward
also records the experts each layer routed each input token to (``engines.routing``): a
prefill sets the request's routes for its whole sequence (a re-prefill after a weight swap
replaces them with the new weights' routes, the ones the later tokens were sampled under),
a decode step appends the row of the token it fed.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from loongsage.engines.cpu_threads import prepare_compute_thread
from loongsage.engines.embedded_rollout.kv_batch import KVBatch, LogitsHead
from loongsage.engines.embedded_rollout.params import SamplingParams
from loongsage.engines.embedded_rollout.prefix_cache import PrefixCache, Segment
from loongsage.engines.embedded_rollout.sampler import RowSettings, sample
from loongsage.engines.embedded_rollout.slack_cache import compacting_order
from loongsage.engines.routing import MoeRouters, RoutingPass
from loongsage.engines.sampling_seed import derive_seed, token_uniform

log = logging.getLogger(__name__)


@dataclass
class Request:
    """A generation request and its growing output (appended to by the scheduler only)."""

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    # (tokens so far, finished); called on the scheduler thread (the submitter's if refused)
    on_update: Callable[[int, bool], None]
    stream: bool = False
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    # MoE routes of the tokens fed so far ([n, layers, top_k] pieces; engines.routing)
    routes: list[torch.Tensor] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    done: bool = False  # set last, after finish and outputs are final
    created: float = field(default_factory=time.monotonic)
    seed: int = 0  # its sampling seed, set when queued (the client's, else from the engine's and rid)
    cached_tokens: int | None = None  # prompt tokens its first prefill did not compute (SGLang's meta_info)


class Scheduler:
    """Owns the model between decode steps; all public methods are thread-safe."""

    def __init__(self, model: torch.nn.Module, *, fp32_lm_head: bool, eos_ids: set[int],
                 max_len: int, max_running: int, seed: int, weight_version: int,
                 num_threads: int = 0, prefix_cache_bytes: int = 0, keep_prefix_cache_on_update: bool = False):
        self.model = model
        self.head = LogitsHead(model, fp32_lm_head)
        self.routers = MoeRouters(model)
        self.eos_ids = eos_ids
        self.max_len = max_len
        self.max_running = max_running
        self.version = weight_version
        self.num_threads = num_threads
        self.seed = seed
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting: list[Request] = []
        self._rows: list[Request] = []
        self._admitting: list[Request] = []  # popped from the queue, not yet in the batch
        self._batch: KVBatch | None = None
        self._settings: RowSettings | None = None
        self._paused = False
        self._stale = False
        self._lost = ""  # why the weights cannot be used (``weights_lost``), until the next swap
        self._stopping = False
        self._closed = False  # the decode loop has returned: calls are refused, not queued
        self._gate = threading.Lock()  # orders a call's check-and-queue against the loop closing
        self.prefix_cache = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self.keep_prefix_cache_on_update = keep_prefix_cache_on_update
        self.stats = {"prefills": 0, "prefill_tokens": 0, "prefill_tokens_shared": 0,
                      "prefill_tokens_cached": 0, "decode_steps": 0, "max_batch": 0}
        self._thread = threading.Thread(target=self._run, name="embedded-rollout-decode",
                                        daemon=True)

    # ---- thread-safe API ---------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        def _stop() -> None:
            self._stopping = True
            self._abort(None, "engine stopped")
        if self._thread.is_alive():
            self.call(_stop).exception()  # refused only when another stop() got there first
            self._thread.join()

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn`` on the decode thread between steps; its result arrives in the future.

        Before ``start`` and after the loop has ended nothing would ever run it, so the future
        fails at once with the reason instead of leaving its caller waiting forever."""
        fut: Future = Future()
        refusal = self._enqueue(fn, fut)
        if refusal:
            fut.set_exception(RuntimeError(refusal))
        return fut

    def submit(self, *reqs: Request) -> None:
        """Queue ``reqs`` as one command: the batch of one ``/generate`` reaches the waiting
        queue whole, so the next admission prefills it together (a group's shared prompt once).
        When the loop is not running they finish at once with ``abort`` and the reason."""
        refusal = self._enqueue(lambda: [self._admit_later(req) for req in reqs], Future())
        for req in reqs if refusal else ():
            self._finish(req, {"type": "abort", "message": refusal})

    def _enqueue(self, fn: Callable[[], Any], fut: Future) -> str:
        """Queue ``fn`` for the loop; or, when no loop will run it, return why ('' if queued)."""
        with self._gate:  # against the loop closing between the check and the put
            if self._thread.ident is None:
                return "embedded engine: the decode loop has not started; start() the engine first"
            if self._closed:
                return "embedded engine: stopped; it takes no more calls"
            self._cmds.put((fn, fut))
            return ""

    def abort(self, rid: str | None, *more: str) -> Future:
        """Abort the requests named (``rid`` and ``more``), or all (``rid`` None), in one command,
        so no decode step or observer sees some of them aborted and the rest still queued; the
        future gives how many were aborted."""
        named = None if rid is None else {rid, *more}
        return self.call(lambda: self._abort(named, "aborted by request"))

    def pause(self, mode: str) -> Future:
        return self.call(lambda: self._pause(mode))

    def resume(self) -> Future:
        return self.call(lambda: setattr(self, "_paused", False))

    def flush_cache(self) -> Future:
        """Drop the prefix cache when idle (True); False, keeping it, while requests run or wait."""
        def _flush() -> bool:
            if self._rows or self._waiting:
                return False
            self.drop_prefix_cache()
            return True
        return self.call(_flush)

    def drop_prefix_cache(self) -> None:
        """Forget every cached prefix (call on the decode thread: ``call``)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def swap_weights(self, apply: Callable[[], None], version: int) -> Future:
        """Run ``apply`` (which writes the new tensors) between steps and bump the version."""
        def _swap() -> int:
            apply()
            self.head.refresh()
            if not self.keep_prefix_cache_on_update:  # KV computed by the old weights
                self.drop_prefix_cache()
            self.version, self._lost = version, ""
            self._stale = self._stale or bool(self._rows)
            return version
        return self.call(_swap)

    def weights_lost(self, reason: str) -> Future:
        """Abort everything and refuse new requests with ``reason`` until the next swap."""
        def _lose() -> None:
            self._lost = reason
            self.drop_prefix_cache()
            self._fail_all(reason)
        return self.call(_lose)

    def load(self) -> dict[str, int]:
        load = {"running": len(self._rows), "waiting": len(self._waiting), **self.stats}
        if self.prefix_cache is not None:
            cache = self.prefix_cache
            load.update({"prefix_cache_tokens": cache.tokens, "prefix_cache_bytes": cache.nbytes,
                         **{f"prefix_cache_{k}": v for k, v in cache.stats.items()}})
        return load

    @property
    def device(self) -> torch.device:
        """Where the model is now (``EmbeddedRolloutEngine.offload`` moves it between steps)."""
        return next(self.model.parameters()).device

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    @property
    def paused(self) -> bool:
        return self._paused

    # ---- decode thread -------------------------------------------------------------------
    def _run(self) -> None:
        try:
            prepare_compute_thread(self.num_threads)
            while not self._stopping:
                idle = self._paused or (not self._rows and not self._waiting)
                self._drain(block=idle)
                if self._stopping or self._paused or not (self._rows or self._waiting):
                    continue
                try:
                    with torch.inference_mode():
                        self._step()
                except Exception as exc:  # a failed forward must not strand callers
                    log.exception("decode step failed")
                    self._fail_all(f"engine error: {exc!r}")
        finally:  # however the loop ended, nothing queued or admitted is left waiting
            with self._gate:
                self._closed = True
            self._drain(block=False)
            self._fail_all("engine stopped")

    def _drain(self, block: bool) -> None:
        try:
            item = self._cmds.get(block=block)
        except queue.Empty:
            return
        while True:
            fn, fut = item
            try:
                fut.set_result(fn())
            except Exception as exc:
                fut.set_exception(exc)
            try:
                item = self._cmds.get_nowait()
            except queue.Empty:
                return

    def _admit_later(self, req: Request) -> None:
        asked = req.params.sampling_seed
        req.seed = asked if asked is not None else derive_seed(self.seed, req.rid)
        if self._lost:
            self._finish(req, {"type": "abort", "message": self._lost})
        elif req.params.max_new_tokens == 0:
            self._finish(req, {"type": "length", "length": 0})
        else:
            self._waiting.append(req)

    def _pause(self, mode: str) -> None:
        if mode == "abort":
            self._abort(None, "aborted by pause_generation(mode=abort)")
        self._stale = self._stale or (mode == "retract" and bool(self._rows))
        self._paused = True

    def _abort(self, rids: set[str] | None, message: str) -> int:
        victims = [r for r in self._waiting + self._rows if rids is None or r.rid in rids]
        for r in victims:
            r.finish = {"type": "abort", "message": message}
        self._waiting = [r for r in self._waiting if r.finish is None]
        self._evict_finished()
        for r in victims:
            self._finish(r, r.finish)
        return len(victims)

    def _fail_all(self, message: str) -> None:
        """Finish every request with ``abort`` and drop the batch (its state may be torn)."""
        victims = self._waiting + self._rows + self._admitting
        self._waiting, self._rows, self._admitting = [], [], []
        self._batch, self._settings, self._stale = None, None, False
        for r in victims:
            if not r.done:
                self._finish(r, {"type": "abort", "message": message})

    def _finish(self, req: Request, reason: dict[str, Any]) -> None:
        req.finish = reason
        req.done = True
        req.on_update(len(req.output_ids), True)

    def _step(self) -> None:
        if self._stale:  # weights changed under running requests: recompute their KV
            self._waiting = self._rows + self._waiting
            self._rows, self._batch, self._settings, self._stale = [], None, None, False
        free = self.max_running - len(self._rows)
        if free > 0 and self._waiting:
            new, self._waiting = self._waiting[:free], self._waiting[free:]
            self._admitting = new
            for group in self._prefill_groups(new):
                self._admit(group)
            self._admitting, self._settings = [], None
            self._evict_finished()
        if self._rows:
            tokens = torch.tensor([r.output_ids[-1] for r in self._rows], dtype=torch.long,
                                  device=self.device)
            with self.routers.routing(capture=self.routers.is_moe) as routed:
                logits = self._batch.decode(self.head, tokens)
            self._record_decode_routes(self._rows, routed)
            self.stats["decode_steps"] += 1
            self.stats["max_batch"] = max(self.stats["max_batch"], len(self._rows))
            if self._settings is None:
                self._settings = self._row_settings(self._rows)
            self._append(self._rows, logits, self._settings)
            self._evict_finished()
        for r in self._rows:
            if r.stream:
                r.on_update(len(r.output_ids), False)

    def _prefill_groups(self, new: list[Request]) -> list[list[Request]]:
        """The requests to prefill together: all of them; with a prefix cache, those that
        continue a cached prefix apart from those computed whole. One forward feeds its longest
        uncached suffix to every row (``KVBatch._prefill_distinct``), so a fresh prompt beside a
        continued turn would make the turn compute as many tokens as the prompt."""
        if self.prefix_cache is None:
            return [new]
        warm = [self.prefix_cache.cached_length((r.prompt_ids + r.output_ids)[:-1]) > 0 for r in new]
        groups = [[r for r, w in zip(new, warm) if not w], [r for r, w in zip(new, warm) if w]]
        return [group for group in groups if group]

    def _admit(self, new: list[Request]) -> None:
        """Prefill ``new`` in one forward, sample their first tokens, add them to the batch."""
        with self.routers.routing(capture=self.routers.is_moe) as routed:
            batch, logits = KVBatch.prefill(self.head, [r.prompt_ids + r.output_ids for r in new],
                                            self.device, self.prefix_cache)
        self._record_prefill_routes(new, routed, batch)
        self.stats["prefills"] += 1
        self.stats["prefill_tokens"] += sum(len(r.prompt_ids) + len(r.output_ids) for r in new)
        self.stats["prefill_tokens_shared"] += batch.shared_tokens
        self.stats["prefill_tokens_cached"] += batch.cached_tokens
        for i, r in enumerate(new):
            if r.cached_tokens is None:
                r.cached_tokens = min(batch.reused[i], len(r.prompt_ids))
            self._keep_prefix(r, batch, i)
        self._append(new, logits, self._row_settings(new))
        self._batch = batch if self._batch is None else self._batch.merge(batch)
        self._rows += new

    def _record_prefill_routes(self, reqs: list[Request], routed: RoutingPass, batch: KVBatch) -> None:
        """Each request's routes for its whole sequence: a row served partly from the prefix
        cache takes the cached tokens' routes, then those of the tokens the forward fed (its real
        columns); identical prompts run once map to their forward row (``prefill_rows``)."""
        if not routed.captured:
            return
        rows = batch.prefill_rows
        forwarded = len(reqs) if rows is None else int(rows.max()) + 1
        routes = routed.routes().view(forwarded, -1, *self.routers.shape)
        if rows is not None:
            routes = routes[rows.cpu()]
        fed = batch.mask[:, -batch.fed:].bool().cpu()
        for i, r in enumerate(reqs):
            cached = batch.reused_routes[i]
            own = routes[i][fed[i]]
            r.routes = [own if cached is None else torch.cat([cached.to(own.device, own.dtype), own])]

    def _record_decode_routes(self, reqs: list[Request], routed: RoutingPass) -> None:
        """Append the route of the one token each row fed."""
        if not routed.captured:
            return
        routes = routed.routes().view(len(reqs), -1, *self.routers.shape)
        for i, r in enumerate(reqs):
            r.routes.append(routes[i])

    def _keep_prefix(self, req: Request, batch: KVBatch, row: int) -> None:
        """Put the tokens ``req`` has fed so far (row ``row`` of ``batch``), their KV and routes,
        in the prefix cache (only what it lacks is copied)."""
        if self.prefix_cache is None:
            return
        fed = int(batch.lengths[row])
        tokens = (req.prompt_ids + req.output_ids)[:fed]
        take_kv = batch.row_segment(row)
        routes = torch.cat(req.routes) if req.routes else None

        def take(start: int, end: int) -> Segment:
            part = take_kv(start, end)
            part.routes = None if routes is None else routes[start:end]
            return part

        self.prefix_cache.insert(tokens, take)

    def _row_settings(self, reqs: list[Request]) -> RowSettings:
        ps = [r.params for r in reqs]
        return RowSettings.build([p.temperature for p in ps], [p.top_p for p in ps],
                                 [p.top_k for p in ps], [p.min_p for p in ps], self.device)

    def _append(self, reqs: list[Request], logits: torch.Tensor, settings: RowSettings) -> None:
        uniforms = torch.tensor([token_uniform(r.seed, len(r.prompt_ids) + len(r.output_ids))
                                 for r in reqs], dtype=torch.float64)
        tokens, logprobs = sample(logits, settings, uniforms)
        for r, tok, lp in zip(reqs, tokens.tolist(), logprobs.tolist()):
            r.output_ids.append(tok)
            r.logprobs.append(lp)
            r.versions.append(self.version)
            p = r.params
            if tok in p.stop_token_ids or (not p.ignore_eos and tok in self.eos_ids):
                r.finish = {"type": "stop", "matched": tok}
            elif len(r.output_ids) >= p.max_new_tokens:
                r.finish = {"type": "length", "length": p.max_new_tokens}
            elif len(r.prompt_ids) + len(r.output_ids) >= self.max_len:
                r.finish = {"type": "length", "length": len(r.output_ids)}

    def _evict_finished(self) -> None:
        alive = [r.finish is None for r in self._rows]
        if all(alive):
            return
        keep = compacting_order(alive)
        done = [r for r in self._rows if r.finish is not None]
        for i, r in enumerate(self._rows):
            if r.finish is not None and self._batch is not None:
                self._keep_prefix(r, self._batch, i)
        self._rows = [self._rows[i] for i in keep]
        self._batch = self._batch.select(keep) if self._batch is not None else None
        self._settings = None
        for r in done:
            if r.finish.get("type") != "abort":
                self._finish(r, r.finish)
