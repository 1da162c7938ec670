"""The one load balancer over a run's rollout engines: sticky per session, cache-aware, least-loaded.

A session (a router trajectory) keeps its replica for its whole life, so the replica's
prefix cache holds its tokens. A new session, or a request without one, goes to the replica
that was sent the longest prefix of its prompt (``engines.prefix_index``: a group's prompt
sent again, a task shared by several sessions) when that prefix is at least ``prefix_share``
of the prompt and the load allows it: that replica has at most ``prefix_slack`` more requests
in flight than the least-loaded one (sgl-router's cache-aware policy has the same two knobs,
``cache_threshold`` and its balance thresholds). A shared system prompt alone is too little to
pile sessions onto one replica for. Otherwise it goes to the replica with the fewest in-flight
requests, ties broken by the fewest sticky sessions, then by index. At most ``max_inflight`` requests per
replica are sent at once; the rest wait here (cheap) rather than piling connections onto a
busy engine.

The pool is itself an engine client (``agenerate``, ``agenerate_batch``, ``astream_generate``,
``aabort``), so a white-box agent given the pool and the AgentFlow router built over the same
pool share one set of in-flight counts: a run balances its engines in one place. A batch (a
group's samples) goes to one replica as one HTTP request and counts as its prompts: each is a
generation request in the load, against ``max_inflight`` and in ``take_served``, which reports
how many each replica got since it was last asked (a step's ``rollout/engine_requests/<i>``).

Failover: a replica is *down* from the moment a request to it cannot reach it (or the
engine monitor, ``controller.engine_health``, declares it dead or hung) until the monitor
puts a restarted engine in its place (``replace``). A down replica gets no new requests and
its sticky sessions move on their next turn; a ``/generate`` sent through the pool that
fails for an unreachable engine, or whose replica goes down while it waits (a hung engine
never answers), is sent again to a live replica (the restarted one included), at most
``max_attempts`` times in all. Every retry is recorded (``take_retries``: rid, attempt,
replica, why), never silent; when no replica is up for ``wait_s`` seconds the request fails
with an ``EngineError`` saying so. The AgentFlow router fails a turn over with the same
pieces (``unless_down``, ``stream_unless_down``, ``replica_failed``, ``live_replica``): it
keeps the tokens the dead replica streamed and continues the turn elsewhere
(``agentflow.turns``).

Partial rollout at a weight update (``abort_for_update``): the pool *holds* (no request is
sent to an engine until ``resume_after_update``), aborts every running generation, and
returns once none is being generated. A request that arrives while the pool holds waits
here, not at the engine, so in colocated mode nothing reaches an engine whose device the
trainer holds, and every token sampled after ``resume_after_update`` comes from the new
weights. ``update_aborts`` counts these aborts: the AgentFlow router continues a turn the
engine aborted for one of them (``agentflow.turns``) and fails a turn aborted for any other
reason. A request sent through the pool as an engine client (``agenerate``: white-box agents,
whose groups the scheduler waits for before the update) does not wait out the hold: one that
finds the pool holding before it reaches an engine (queued behind ``max_inflight``, or sent
again after its replica failed, e.g. an engine killed during the update's abort) returns at
once as aborted with no new tokens, exactly like the requests the update aborted, so its
caller continues it under the new weights; waiting would deadlock, since the hold ends only
after every such group has returned.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncGenerator, AsyncIterator, Hashable, Sequence

from loongsage.engines.client import SamplingParams, batch_rids, per_prompt
from loongsage.engines.replies import EngineError, GenerateOutput
from loongsage.engines.prefix_index import PrefixIndex

DOWN_POLL_S = 0.2  # how often a waiting request looks whether its replica went down
HOLD_POLL_S = 0.02  # how often a held request (or abort_for_update) looks again
_END = object()  # stream_unless_down: the stream ended


@dataclass
class Retry:
    """One request sent again because its replica failed."""

    rid: str
    attempt: int  # the attempt that failed (1 = the first send)
    replica: int
    reason: str


@dataclass
class Slot:
    """A request's turn at a replica: its client, and ``EnginePool.update_aborts`` when it was sent."""

    client: Any
    update_aborts: int


class ReplicaDown(Exception):
    """The replica serving a request was declared down while the request waited."""


class HeldForUpdate(Exception):
    """An ``agenerate`` request found the pool holding for a weight update before it reached an engine."""


def held_output(rid: str, prompt_tokens: int, attempt: int) -> GenerateOutput:
    """What a request held for a weight update returns: aborted, nothing sampled (module docstring)."""
    return GenerateOutput(output_ids=[], output_logprobs=[], finish_reason="abort", weight_version=None,
                          prompt_tokens=prompt_tokens, rid=rid, output_weight_versions=[],
                          meta_info={"attempt": attempt, "held_for_update": True})


class SendGate:
    """At most ``size`` prompts in flight to one replica. A batch takes one unit per prompt (at
    most ``size``), and one caller takes its units at a time, so two batches never each hold
    part of what both need and wait for the rest."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._units = asyncio.Semaphore(size)
        self._taking = asyncio.Lock()

    @asynccontextmanager
    async def held(self, prompts: int) -> AsyncIterator[None]:
        units, taken = min(prompts, self.size), 0
        try:
            async with self._taking:
                while taken < units:
                    await self._units.acquire()
                    taken += 1
            yield
        finally:
            for _ in range(taken):
                self._units.release()


class EnginePool:
    def __init__(self, clients: Sequence[Any], max_inflight: int = 64, *, max_attempts: int = 3,
                 wait_s: float = 300.0, prefix_slack: int = 4, prefix_share: float = 0.5) -> None:
        if not clients:
            raise ValueError("the engine pool needs at least one engine replica")
        if max_inflight < 1:
            raise ValueError("agentflow.max_inflight_per_engine: must be >= 1")
        self.clients = list(clients)
        self.max_inflight = max_inflight
        self.max_attempts = max_attempts
        self.wait_s = wait_s
        self.down: dict[int, str] = {}  # replica -> why it is down
        self._retries: list[Retry] = []
        self._gates: list[SendGate] | None = None  # made in the serving loop
        self.inflight = [0] * len(self.clients)
        self.sessions = [0] * len(self.clients)
        self.served = [0] * len(self.clients)
        self._sticky: dict[Hashable, int] = {}
        self.prefix_slack, self.prefix_share = prefix_slack, prefix_share
        self.prefixes = [PrefixIndex() for _ in self.clients]  # what each replica was sent
        self.held = False  # from abort_for_update to resume_after_update: nothing is sent
        self.update_aborts = 0  # abort_for_update calls so far
        self._sending = 0  # requests past the hold, at an engine now (any thread's loop)
        self._sending_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.clients)

    def least_loaded(self) -> int:
        """The live replica with the fewest in-flight requests (every replica when all are down)."""
        live = [i for i in range(len(self.clients)) if i not in self.down] or range(len(self.clients))
        return min(live, key=lambda i: (self.inflight[i], self.sessions[i], i))

    def choose(self, prompt: Sequence[int] | None = None) -> int:
        """The live replica for a request without a replica yet: the one sent the longest
        prefix of ``prompt`` when the load allows, else the least-loaded (module docstring).
        ``prompt`` is recorded as sent there."""
        idx = least = self.least_loaded()
        if prompt:
            live = [i for i in range(len(self.clients)) if i not in self.down] or [least]
            held = {i: self.prefixes[i].match(prompt) for i in live}
            best = max(live, key=lambda i: (held[i], -self.inflight[i], -i))
            if (held[best] > held[least] and held[best] >= self.prefix_share * len(prompt)
                    and self.inflight[best] <= self.inflight[least] + self.prefix_slack):
                idx = best
            self.prefixes[idx].record(prompt)
        return idx

    def pick(self, key: Hashable, prompt: Sequence[int] | None = None) -> int:
        """The replica index for session ``key`` (assigned on first use by ``choose(prompt)``,
        moved off a down one)."""
        idx = self._sticky.get(key)
        if idx is not None and idx in self.down and len(self.down) < len(self.clients):
            self.release(key)
            idx = None
        if idx is None:
            idx = self.choose(prompt)
            self._sticky[key] = idx
            self.sessions[idx] += 1
        elif prompt:
            self.prefixes[idx].record(prompt)
        return idx

    # ---- failover ------------------------------------------------------------------------
    def mark_down(self, idx: int, reason: str, client: Any = None) -> None:
        """Send no new requests to replica ``idx`` (safe from any thread). ``client``: the one
        that failed; a late failure of a client since replaced (its engine restarted, the
        request sent before) leaves the restarted engine up."""
        if client is None or self.clients[idx] is client:
            self.down.setdefault(idx, reason)

    def mark_up(self, idx: int) -> None:
        """Replica ``idx`` answered after all (a transient failure): use it again."""
        self.down.pop(idx, None)

    def replace(self, idx: int, client: Any) -> None:
        """Put a restarted engine's client in replica ``idx``'s place and use it again (its
        cache starts empty)."""
        self.clients[idx] = client
        self.prefixes[idx].clear()
        self.down.pop(idx, None)

    def take_retries(self) -> list[Retry]:
        """Requests sent again since the last call."""
        retries, self._retries = self._retries, []
        return retries

    def replica_failed(self, idx: int, rid: str, attempt: int, reason: str, client: Any = None) -> None:
        """Request ``rid``'s send number ``attempt`` failed with replica ``idx`` (``client``, as
        for ``mark_down``): mark it down and record the retry that follows."""
        self.mark_down(idx, reason, client)
        self._retries.append(Retry(rid, attempt, idx, reason))

    async def live_replica(self, leave_on_hold: bool = False, prompt: Sequence[int] | None = None) -> int:
        """``choose(prompt)`` once a replica is up; ``EngineError`` after ``wait_s``;
        ``leave_on_hold``: ``HeldForUpdate`` if the pool holds for an update while none is up."""
        deadline = time.monotonic() + self.wait_s
        while len(self.down) == len(self.clients):
            if leave_on_hold and self.held:
                raise HeldForUpdate()
            if time.monotonic() > deadline:
                raise EngineError("/generate", f"no rollout engine up for {self.wait_s:.0f} s "
                                  f"(down: {self.down})")
            await asyncio.sleep(DOWN_POLL_S)
        return self.choose(prompt)

    async def unless_down(self, idx: int, request: Any) -> Any:
        """Await ``request``; raise ``ReplicaDown`` (cancelling it, and waiting until it is
        cancelled) if replica ``idx`` goes down first."""
        task = asyncio.ensure_future(request)
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=DOWN_POLL_S)
                if not task.done() and idx in self.down:
                    raise ReplicaDown(self.down[idx])
            return task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait({task})

    async def stream_unless_down(self, idx: int, items: AsyncGenerator[Any, None]) -> AsyncIterator[Any]:
        """``items`` one by one; ``ReplicaDown`` (the stream closed) if replica ``idx`` goes
        down while the next one is awaited (a hung engine streams nothing more)."""
        try:
            while (item := await self.unless_down(idx, anext(items, _END))) is not _END:
                yield item
        finally:
            await items.aclose()

    @asynccontextmanager
    async def slot(self, idx: int, leave_on_hold: bool = False, prompts: int = 1) -> AsyncIterator["Slot"]:
        """Count a request of ``prompts`` prompts against replica ``idx``, wait for one of its
        send slots (and while the pool holds); yields a ``Slot``: the client and the
        ``update_aborts`` count when the request passed the hold (an abort for an update after
        that one aborted this request). ``leave_on_hold``: raise ``HeldForUpdate`` instead of
        waiting while the pool holds. A batched request counts each of its prompts, in the
        replica's load and against ``max_inflight`` (``SendGate``)."""
        if self._gates is None:
            self._gates = [SendGate(self.max_inflight) for _ in self.clients]
        self.inflight[idx] += prompts
        try:
            async with self._gates[idx].held(prompts):
                while True:
                    with self._sending_lock:
                        if not self.held:
                            self._sending += 1
                            slot = Slot(self.clients[idx], self.update_aborts)
                            self.served[idx] += prompts
                            break
                    if leave_on_hold:
                        raise HeldForUpdate()
                    await asyncio.sleep(HOLD_POLL_S)
                try:
                    yield slot
                finally:
                    with self._sending_lock:
                        self._sending -= 1
        finally:
            self.inflight[idx] -= prompts

    # ---- partial rollout -------------------------------------------------------------------
    async def abort_for_update(self) -> None:
        """Hold new requests and abort every running one (partial rollout at a weight update);
        return once no request is being generated. Aborts again while one still runs (it was
        on its way to the engine when the first abort arrived)."""
        with self._sending_lock:
            self.held = True
            self.update_aborts += 1
        while True:
            await self._abort_live()
            if self._sending == 0:
                return
            await asyncio.sleep(HOLD_POLL_S)

    async def _abort_live(self) -> None:
        """``abort_all`` on every live replica; one that cannot be reached is marked down (its
        requests fail over, as a failed request's replica does) instead of failing the update."""
        live = [i for i in range(len(self.clients)) if i not in self.down]
        clients = [self.clients[i] for i in live]
        results = await asyncio.gather(*(client.aabort(abort_all=True) for client in clients),
                                       return_exceptions=True)
        for idx, client, result in zip(live, clients, results):
            if isinstance(result, EngineError) and result.status is None:
                self.mark_down(idx, f"abort at a weight update: {result}", client)
            elif isinstance(result, BaseException):
                raise result

    def resume_after_update(self) -> None:
        """New weights are live: send the held requests (continued turns among them)."""
        self.held = False

    def take_served(self) -> list[int]:
        """Requests each replica received since the last call (then counting restarts)."""
        served, self.served = self.served, [0] * len(self.clients)
        return served

    def take_prompt_usage(self) -> tuple[int, int]:
        """``(prompt tokens, of them cached)`` of the generations every replica finished since
        the last call (each client's ``usage``; a client without one counts nothing)."""
        counts = [client.usage.take() for client in self.clients if hasattr(client, "usage")]
        return sum(c[0] for c in counts), sum(c[1] for c in counts)

    def release(self, key: Hashable) -> None:
        idx = self._sticky.pop(key, None)
        if idx is not None:
            self.sessions[idx] -= 1

    # ---- the pool as an engine client ----------------------------------------------------
    async def agenerate(self, input_ids: Sequence[int], sampling_params: dict[str, Any] | None = None,
                        rid: str | None = None) -> Any:
        """``/generate`` on the least-loaded live replica, sent again elsewhere when that
        replica dies or hangs, returned aborted when held for a weight update (module
        docstring); ``meta_info["attempt"]`` says which send produced the output."""
        [out] = await self.agenerate_batch([input_ids], sampling_params, rids=[rid or uuid.uuid4().hex])
        return out

    async def agenerate_batch(self, prompts: Sequence[Sequence[int]],
                              sampling_params: SamplingParams = None,
                              rids: Sequence[str] | None = None) -> list[Any]:
        """``agenerate`` for several prompts in one request to one replica (a group's samples,
        which then share a prefill there): failed over, retried and held as one. A batch whose
        replica fails is sent again whole, its samples that had finished there included (the
        engine answers a batch only once all of it is done); each rid's retry is recorded."""
        rids = batch_rids(prompts, rids)
        if not prompts:
            return []
        label, attempt = rids[0] if len(rids) == 1 else f"{rids[0]} (+{len(rids) - 1} more)", 0
        try:
            while True:
                attempt += 1
                idx = await self.live_replica(leave_on_hold=True, prompt=prompts[0])
                try:
                    async with self.slot(idx, leave_on_hold=True, prompts=len(prompts)) as slot:
                        client = slot.client
                        outs = await self.unless_down(idx, self._send(client, prompts, sampling_params, rids))
                except (EngineError, ReplicaDown) as err:
                    if isinstance(err, EngineError) and err.status is not None:
                        raise  # the engine answered: a refusal, not a failure of the replica
                    reason = str(err)
                    if attempt == self.max_attempts:
                        self.mark_down(idx, reason, client)
                        raise EngineError("/generate", f"request {label} failed on {attempt} replicas, "
                                          f"the last: {reason}") from err
                    for rid in rids:
                        self.replica_failed(idx, rid, attempt, reason, client)
                    continue
                for ids, out in zip(prompts, outs):
                    out.meta_info["attempt"] = attempt
                    self.prefixes[idx].record(list(ids) + out.output_ids)  # a next turn's prefix
                return outs
        except HeldForUpdate:
            return [held_output(rid, len(ids), attempt) for rid, ids in zip(rids, prompts)]

    @staticmethod
    async def _send(client: Any, prompts: Sequence[Sequence[int]], sampling_params: SamplingParams,
                    rids: list[str]) -> list[Any]:
        """One prompt as a plain ``agenerate`` (what every engine client has), several batched."""
        if len(prompts) == 1:
            return [await client.agenerate(prompts[0], per_prompt(sampling_params, 0), rid=rids[0])]
        return await client.agenerate_batch(prompts, sampling_params, rids=rids)

    async def aabort(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        """Abort ``rid`` (or everything) on every replica: the pool does not track which one runs it."""
        await asyncio.gather(*(c.aabort(rid, abort_all=abort_all) for c in self.clients))
