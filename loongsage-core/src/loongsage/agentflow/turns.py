"""Running one request: middlewares, TITO planning, generation, recording, turn events.

``TurnRunner.prepare`` does everything that can refuse a request before any byte is sent
(parse errors, unknown model, oversize context), so a refused streaming request still gets a
plain HTTP error; a trajectory opened with the rollout's sampling parameters gets them on
every trained turn, whatever the client sent (``messages.enforce_sampling``). A turn samples
with the client's ``seed`` (any of the three wire protocols) as the engine's ``sampling_seed``;
without one, a trajectory opened with a seed (``metadata["sampling_seed"]``, the rollout's)
gives each of its segments a seed derived from it, so its tokens depend on neither the
engine nor the batch they were decoded in (``engines.sampling_seed``).
``TurnRunner.events`` then generates and yields ``StreamEvent``s; the last one carries the
finished ``TurnResult``. A failed or abandoned turn aborts its engine
request, rolls its prompt tokens back when nothing was appended after them, and marks the
trajectory failed (engine failure) so the collector never trains on a half turn.

Partial rollout: a turn whose engine request is aborted for a weight update
(``EnginePool.abort_for_update``) is not a failure. It is sent again once the pool lets
requests through (the new weights are live; in colocated mode the engine has its device
back), from the turn's prompt plus every token sampled so far, with what is left of its
token budget, and again at every later update, until it ends another way. Its tokens keep
their logprobs and the weight version that sampled each, and the client (streaming or not,
any wire protocol) gets one reply: it only takes longer. The trajectory counts such
continuations in ``metadata["continued_turns"]``.

Failover: a turn whose replica dies (the engine cannot be reached, or its stream breaks) or
is declared down while the turn waits on it (``EnginePool.unless_down``: the engine monitor
found it hung) is continued the same way on a live replica (the restarted one included),
once one is up: from the prompt plus every token received so far (a streamed turn keeps
what the agent already got; a non-streamed one receives nothing before its engine answers,
so it starts over), with what is left of its budget. Each such send is an attempt: the
pool's retry record (``EnginePool.replica_failed``, hence ``engine_events.jsonl`` and
``rollout/engine_retries``) and the trajectory's ``metadata["turn_retries"]`` (a sample's
``reward_info``, logged as ``rollout/turn_retries_mean``) and ``metadata["turn_failovers"]``
(rid, attempt, replica, reason, tokens kept) say so. A turn whose ``EnginePool.max_attempts``
sends all failed is failed as any engine failure; an engine that answers with an HTTP error
(a refusal) is never retried.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any, AsyncIterator

from loongsage.engines.replies import EngineError as EngineCallError
from loongsage.engines.pool import EnginePool, ReplicaDown
from loongsage.agentflow.errors import EngineError
from loongsage.agentflow.generation import (
    Generated, TurnDecoder, abort, generate, stream_generation,
)
from loongsage.agentflow.messages import enforce_sampling
from loongsage.engines.sampling_seed import SEED_KEY, derive_seed
from loongsage.agentflow.middleware import RouterMiddleware, TurnContext
from loongsage.agentflow.protocols.base import StreamEvent, TurnResult
from loongsage.agentflow.tito import (
    ChatRenderer, TurnPlan, plan_tokens, plan_turn, record_generation,
)


@dataclass
class PreparedTurn:
    ctx: TurnContext
    plan: TurnPlan
    seg_len_before: int
    messages_before: int
    replica: int
    rid: str
    sampling: dict[str, Any]
    started: bool = False  # events() ran; else abandon() undoes the planned prompt
    continued: int = 0  # engine requests sent again (after an abort for an update, or a failover)

    @property
    def live_rid(self) -> str:
        """The rid of the turn's current engine request (each continuation gets its own)."""
        return self.rid if not self.continued else f"{self.rid}~{self.continued}"


class TurnRunner:
    def __init__(self, renderer: ChatRenderer, pool: EnginePool,
                 middlewares: list[RouterMiddleware], default_max_tokens: int,
                 max_context: int | None, clamp_max_tokens: bool = True) -> None:
        self.renderer, self.pool, self.middlewares = renderer, pool, middlewares
        self.default_max_tokens, self.max_context = default_max_tokens, max_context
        self.clamp_max_tokens = clamp_max_tokens
        self._counter = itertools.count()
        self._busy: dict[tuple[str, str], set[int]] = {}
        self._background: set[asyncio.Task] = set()

    async def prepare(self, ctx: TurnContext) -> PreparedTurn:
        for mw in self.middlewares:
            await mw.on_request(ctx)
        traj = ctx.trajectory
        sampling = ctx.request.sampling.to_engine(self.default_max_tokens)
        if ctx.trainable:
            sampling, changed = enforce_sampling(sampling, traj.sampling)
            if changed:
                meta = traj.metadata
                meta["sampling_overridden_turns"] = meta.get("sampling_overridden_turns", 0) + 1
                counts = meta.setdefault("sampling_overridden", {})
                for name in changed:
                    counts[name] = counts.get(name, 0) + 1
        busy = self._busy.setdefault(traj.key, set())
        limits = dict(trainable=ctx.trainable, busy=busy, max_context=self.max_context,
                      max_new=sampling["max_new_tokens"], clamp=self.clamp_max_tokens)
        plan = plan_tokens(traj, ctx.request.prompt_ids, **limits) \
            if ctx.request.prompt_ids is not None else \
            plan_turn(traj, ctx.request, self.renderer, subagent=ctx.subagent, **limits)
        sampling["max_new_tokens"] = plan.max_new
        traj_seed = traj.metadata.get(SEED_KEY)
        if SEED_KEY not in sampling and traj_seed is not None:  # the client sent no seed
            sampling[SEED_KEY] = derive_seed(traj_seed, plan.segment.segment_id)
        busy.add(plan.segment.segment_id)
        ctx.request.prompt_tokens = len(plan.prompt_ids)
        rid = f"{traj.trajectory_id}#{traj.attempt_id}#{next(self._counter)}"
        return PreparedTurn(ctx, plan, plan.seg_len_before, plan.messages_before,
                            self.pool.pick(traj.key, plan.prompt_ids), rid, sampling)

    async def events(self, turn: PreparedTurn, stream: bool) -> AsyncIterator[StreamEvent]:
        turn.started = True
        ctx, seg, traj = turn.ctx, turn.plan.segment, turn.ctx.trajectory
        decoder = TurnDecoder(self.renderer.tokenizer, ctx.parser)
        gen, finished = Generated(), False
        try:
            async for piece in self._sample(turn, decoder, gen, stream):
                yield StreamEvent(text=piece)
            if gen.finish_reason == "abort":
                raise EngineError(f"the engine aborted request {turn.live_rid}")
            tail, parsed = decoder.finish(gen.output_ids)
            message = {"role": "assistant", "content": parsed.content,
                       "tool_calls": [c.to_openai() for c in parsed.tool_calls] or None}
            record_generation(traj, seg, gen.output_ids, gen.logprobs, gen.versions,
                              gen.finish_reason, message, decoder.stop_text(gen), gen.routed_experts)
            result = TurnResult(content=parsed.content, tool_calls=parsed.tool_calls,
                                finish_reason=gen.finish_reason,
                                prompt_tokens=len(turn.plan.prompt_ids),
                                completion_tokens=len(gen.output_ids), model=ctx.request.model,
                                output_ids=list(gen.output_ids), output_logprobs=list(gen.logprobs))
            for mw in self.middlewares:
                mw.on_result(ctx, result)
            finished = True
            yield StreamEvent(text=tail, result=result)
        except EngineError as err:
            self._fail(turn, str(err))
            raise
        except (asyncio.CancelledError, GeneratorExit):
            if not finished:  # the client left mid-turn: keep no half turn
                traj.rollback(seg, turn.seg_len_before, turn.messages_before)
            raise
        except Exception as err:  # engine transport failure: an error to the client, never a hang
            why = f"{type(err).__name__}: {err}"
            self._fail(turn, why)
            raise EngineError(f"engine request {turn.rid} failed: {why}") from err
        finally:
            self._busy.get(traj.key, set()).discard(seg.segment_id)
            if not finished:
                client = self.pool.clients[turn.replica]
                task = asyncio.get_running_loop().create_task(self._abort(client, turn.live_rid))
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    async def _sample(self, turn: PreparedTurn, decoder: TurnDecoder, gen: Generated,
                      stream: bool) -> AsyncIterator[str]:
        """Sample the turn into ``gen``, yielding text pieces when streaming; continue it after
        an abort for a weight update or on another replica after a failure (module docstring)."""
        budget, attempt = turn.sampling["max_new_tokens"], 1
        while True:
            failure = None
            try:
                async with self.pool.slot(turn.replica) as slot:
                    ids = turn.plan.prompt_ids + gen.output_ids
                    sampling = {**turn.sampling, "max_new_tokens": budget - len(gen.output_ids)}
                    if stream:
                        pieces = stream_generation(slot.client, ids, sampling, turn.live_rid, decoder, gen)
                        async for piece in self.pool.stream_unless_down(turn.replica, pieces):
                            yield piece
                    else:
                        await self.pool.unless_down(
                            turn.replica, generate(slot.client, ids, sampling, turn.live_rid, gen))
            except (EngineCallError, ReplicaDown) as err:
                if isinstance(err, EngineCallError) and err.status is not None:
                    raise  # the engine answered: a refusal, not a failure of the replica
                failure = str(err)
            else:
                if gen.finish_reason != "abort" or self.pool.update_aborts == slot.update_aborts:
                    return
            if len(gen.output_ids) >= budget:
                gen.finish_reason = "length"
                return
            if failure is None:
                self._count(turn, "continued_turns")
            else:
                await self._fail_over(turn, attempt, failure, len(gen.output_ids), slot.client)
                attempt += 1
            turn.continued += 1

    async def _fail_over(self, turn: PreparedTurn, attempt: int, reason: str, kept: int, client: Any) -> None:
        """Send number ``attempt`` of ``turn`` failed with its replica's ``client``: record it and
        move the turn (and its session) to a live replica, or fail it when that was the last attempt."""
        pool = self.pool
        if attempt >= pool.max_attempts:
            pool.mark_down(turn.replica, reason, client)
            raise EngineError(f"turn {turn.rid} failed on {attempt} engine replica{'s' if attempt > 1 else ''}, the last: {reason}")
        pool.replica_failed(turn.replica, turn.live_rid, attempt, reason, client)
        self._count(turn, "turn_retries")
        turn.ctx.trajectory.metadata.setdefault("turn_failovers", []).append(
            {"rid": turn.live_rid, "attempt": attempt, "replica": turn.replica, "reason": reason,
             "tokens_kept": kept})
        await pool.live_replica()
        turn.replica = pool.pick(turn.ctx.trajectory.key)

    @staticmethod
    def _count(turn: PreparedTurn, key: str) -> None:
        meta = turn.ctx.trajectory.metadata
        meta[key] = meta.get(key, 0) + 1

    async def abandon(self, turn: PreparedTurn) -> None:
        """Undo a prepared turn whose response never started (the client left first)."""
        if not turn.started:
            traj = turn.ctx.trajectory
            self._busy.get(traj.key, set()).discard(turn.plan.segment.segment_id)
            traj.rollback(turn.plan.segment, turn.seg_len_before, turn.messages_before)

    def forget(self, key: tuple[str, str]) -> None:
        """Drop per-trajectory bookkeeping once a trajectory is finished."""
        self._busy.pop(key, None)

    def _fail(self, turn: PreparedTurn, why: str) -> None:
        traj = turn.ctx.trajectory
        traj.rollback(turn.plan.segment, turn.seg_len_before, turn.messages_before)
        traj.status = "failed"
        traj.error = f"request {turn.rid}: {why}"

    @staticmethod
    async def _abort(client: Any, rid: str) -> None:
        try:
            await abort(client, rid)
        except Exception:  # the engine may be gone; nothing else to clean up
            pass
