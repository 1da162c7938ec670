"""The asynchronous scheduler: rollouts run on an event loop while the trainer trains.

``AsyncScheduler`` runs on the run's rollout event loop (``EventLoopThread``, shared with
the rollout manager; a scheduler built without one starts and owns its own). Rollout calls
run there concurrently, up to the window policy's dispatch gate; the controller's thread
only blocks in ``next_batch`` (until a batch satisfying the gates, the staleness guard
and the per-source quotas is ready) and in the weight-update calls. All bookkeeping is
``Pipeline``'s and runs on the loop thread, so it needs no locks.

``rollout_group`` contract (the lead wires it to the agent loop and engine client):

* called as ``rollout_group(prompt, group_id, version)`` for a new group, and as
  ``rollout_group(prompt, group_id, version, resume_from=group)`` to continue a group whose
  generation was aborted at a weight update (partial rollout): keep the samples of
  ``resume_from`` that finished, continue the ones with ``finish_reason == "abort"`` from
  their tokens, and tag every new token with ``version`` in ``Sample.weight_versions``;
* returns a ``Group`` whose ``group_id`` is the one it was given;
* may be a coroutine function (preferred: runs on the loop) or a plain function (runs in
  a thread pool of ``capacity`` threads).

``quotas(step)`` gives the per-source group counts of a step's batch; it is asked for the
current step and the next ``S'`` (``BatchedPromptSource.quotas`` over the DataMixer).

Weight updates: call ``pause()`` before syncing weights and ``on_weights_updated(v)``
after. ``pause()`` stops dispatching. What happens to a generation in flight at an update is
one thing in every mode: **new weights apply between two decode steps, and every token carries
the version of the weights that sampled it** (``Sample.weight_versions``). The embedded engine
swaps weights between decode steps and recomputes a running request's KV under the new ones;
it reports the version of each token, streamed or not. So:

* without partial rollout, in-flight calls keep running across the update: their requests
  continue under the new weights, and a sample's tokens read ``[v, ..., v, v+1, ...]``;
* with partial rollout, ``pause()`` also awaits ``abort_inflight()`` (the rollout manager's
  ``abort_for_update``: the engine pool holds new requests and aborts every running one) and
  waits until every in-flight call has returned its partial group; those groups continue
  under the new weights once ``on_weights_updated`` is called, which calls
  ``resume_inflight()`` (the pool sends its held requests again) before re-dispatching them.
  A group whose agent continues its own turns (``continues_in_place(prompt)``: router-based
  agents, whose program is still running; the router continues the aborted turn by itself)
  is not waited for: it stays running across the update, is counted once in the window, keeps
  its ``dispatch_version`` (so its deadline) and completes later with mixed versions.

An engine that reports one version per output (SGLang) tags all of an output's tokens with
it; there the per-token split is only as fine as its outputs.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Mapping, Optional, Protocol, Union

from loongsage.data.types import Group, Prompt
from loongsage.runtime.event_loop import EventLoopThread
from loongsage.runtime.metrics import batch_metrics
from loongsage.runtime.pipeline import Pipeline, Ticket
from loongsage.runtime.window import WindowPolicy

RolloutGroup = Callable[..., Union[Awaitable[Group], Group]]
Quotas = Callable[[int], Optional[Mapping[str, int]]]


class PromptSource(Protocol):
    def next_prompt(self) -> Prompt: ...


class SchedulerStalled(RuntimeError):
    """The trainer waits for a batch that no running or permitted rollout can produce."""


def _is_coroutine_function(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


class AsyncScheduler:
    """Fully asynchronous scheduler: implements ``loongsage.runtime.scheduler.Scheduler``."""

    def __init__(
        self,
        policy: WindowPolicy,
        prompt_source: PromptSource,
        rollout_group: RolloutGroup,
        batch_size: int,
        stale_steps: int,
        *,
        quotas: Optional[Quotas] = None,
        oversample: int = 0,
        partial: bool = False,
        abort_inflight: Optional[Callable[[], Union[Awaitable[None], None]]] = None,
        resume_inflight: Optional[Callable[[], None]] = None,
        continues_in_place: Optional[Callable[[Prompt], bool]] = None,
        version: int = 0,
        loop: Optional[EventLoopThread] = None,
    ) -> None:
        if partial and abort_inflight is None:
            raise ValueError(
                "rollout.partial=true: AsyncScheduler needs abort_inflight, a callable that makes "
                "every in-flight rollout_group call return its partial group (e.g. the engine "
                "client's pause_generation(mode='abort'))"
            )
        self._pipeline = Pipeline(
            policy, batch_size, stale_steps, oversample=oversample, partial=partial, version=version
        )
        self._source = prompt_source
        self._rollout = rollout_group
        self._rollout_is_async = _is_coroutine_function(rollout_group)
        self._quotas = quotas
        self._abort = abort_inflight
        self._resume = resume_inflight
        self._in_place = continues_in_place or (lambda prompt: False)
        self._carried: set[int] = set()  # running seqs whose agent continues its own turns
        self._executor = (
            None if self._rollout_is_async
            else ThreadPoolExecutor(self._pipeline.capacity, thread_name_prefix="loongsage-rollout")
        )
        self._tasks: dict[int, asyncio.Task] = {}
        self._changed = asyncio.Event()
        self._error: Optional[BaseException] = None
        self._started = False
        self._closed = False
        self._idle_since: Optional[float] = None
        self._idle_total = 0.0
        self._metrics: dict[str, float] = {}
        self._owns_loop = loop is None
        self._loop_thread = loop if loop is not None else EventLoopThread("loongsage-scheduler")
        self._loop = self._loop_thread.loop

    # ------------------------------------------------------------ public API
    @property
    def pipeline(self) -> Pipeline:
        """The bookkeeping (counters, bounds, policy); read it, never mutate it from outside."""
        return self._pipeline

    def next_batch(self, step: int) -> list[Group]:
        """Block until the batch for ``step`` is ready and return it (exactly B groups)."""
        ahead = range(step, step + self._pipeline.staleness_bound + 1)
        quotas = [self._quotas(s) for s in ahead] if self._quotas is not None else None
        start = time.perf_counter()
        batch, rollout_wait = self._call(self._take(quotas))
        pipe = self._pipeline
        self._metrics = {
            **batch_metrics(
                batch, pipe.version,
                trained=(pipe.trained_samples, pipe.trained_tokens),
                finished=(pipe.finished_samples, pipe.finished_tokens),
            ),
            "rollout/pipeline_buf_size": float(pipe.view().buffered),
            "perf/trainer_wait_s": time.perf_counter() - start,
            "perf/rollout_wait_s": rollout_wait,
        }
        return batch

    def metrics(self) -> dict[str, float]:
        """Metrics of the last ``next_batch`` (see ``loongsage.runtime.metrics``).

        ``perf/trainer_wait_s``: time ``next_batch`` blocked. ``perf/rollout_wait_s``: time
        since the previous batch during which no rollout call was running (dispatch held
        back by the window, a pause, or the capacity). ``rollout/pipeline_buf_size``:
        finished groups left in the buffer after the batch was taken.
        """
        return dict(self._metrics)

    def pause(self) -> None:
        """Call before syncing weights: stop dispatching (and abort in-flight under partial)."""
        self._call(self._pause())

    def on_weights_updated(self, version: int) -> None:
        """New weights are live on the engines: resume (partials continue under ``version``)."""
        self._call(self._updated(version))

    def state_dict(self) -> dict:
        """Pipeline state and, atomically with it, the prompt source's state (if it has one)."""
        return self._call(self._state())

    def load_state_dict(self, state: dict) -> None:
        """Restore before the first ``next_batch``; restores the prompt source too."""
        if self._started:
            raise RuntimeError("AsyncScheduler.load_state_dict must be called before the first next_batch")
        self._pipeline.load_state_dict(state["pipeline"])
        if state.get("prompt_source") is not None:
            self._source.load_state_dict(state["prompt_source"])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._loop_thread.closed:
            self._loop_thread.run(self._cancel_all())
            if self._owns_loop:
                self._loop_thread.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    # -------------------------------------------------------- loop-side work
    def _call(self, coro: Awaitable[Any]) -> Any:
        if self._closed:
            raise RuntimeError("AsyncScheduler is closed")
        return self._loop_thread.run(coro)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"a rollout_group call failed: {self._error!r}") from self._error

    def _pump(self) -> None:
        """Collect what the gate allows, re-dispatch waiting groups, dispatch new ones."""
        pipe = self._pipeline
        pipe.collect()
        if self._started:
            for ticket in pipe.take_waiting():
                self._start(ticket)
            for _ in range(pipe.dispatch_budget()):
                self._start(pipe.dispatch(self._source.next_prompt()))
        self._changed.set()

    def _start(self, ticket: Ticket) -> None:
        if self._idle_since is not None:
            self._idle_total += time.perf_counter() - self._idle_since
            self._idle_since = None
        if self._in_place(ticket.prompt):
            self._carried.add(ticket.seq)
        self._tasks[ticket.seq] = self._loop.create_task(self._run(ticket))

    async def _run(self, ticket: Ticket) -> None:
        kwargs = {"resume_from": ticket.resume_from} if ticket.resume_from is not None else {}
        try:
            if self._rollout_is_async:
                group = await self._rollout(ticket.prompt, ticket.seq, ticket.version, **kwargs)
            else:
                call = functools.partial(self._rollout, ticket.prompt, ticket.seq, ticket.version, **kwargs)
                group = await self._loop.run_in_executor(self._executor, call)
            self._pipeline.complete(ticket.seq, group)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # surfaced to the trainer thread by next_batch
            self._error = self._error or err
        finally:
            del self._tasks[ticket.seq]
            self._carried.discard(ticket.seq)
            if not self._tasks:
                self._idle_since = time.perf_counter()
        try:
            self._pump()
        except Exception as err:  # e.g. the prompt source ran dry
            self._error = self._error or err
            self._changed.set()

    async def _take(self, quotas: Optional[list[Mapping[str, int]]]) -> tuple[list[Group], float]:
        if not self._started:
            self._started = True
            self._idle_since = time.perf_counter()
        pipe = self._pipeline
        while True:
            self._raise_if_failed()
            self._pump()
            batch = pipe.take_batch(quotas)
            if batch is not None:
                return batch, self._drain_idle()
            if not self._tasks:
                raise SchedulerStalled(
                    f"next_batch cannot complete: nothing is running and the window allows no dispatch "
                    f"(paused={pipe.paused}, capacity={pipe.capacity}, in_flight={pipe.view().in_flight}, "
                    f"buffered={pipe.view().buffered}, training={pipe.training}, quotas={quotas[0] if quotas else None}); "
                    "call on_weights_updated after each trained batch"
                )
            self._changed.clear()
            await self._changed.wait()

    def _drain_idle(self) -> float:
        now = time.perf_counter()
        total = self._idle_total + (now - self._idle_since if self._idle_since is not None else 0.0)
        self._idle_total = 0.0
        if self._idle_since is not None:
            self._idle_since = now
        return total

    async def _pause(self) -> None:
        self._pipeline.pause()
        if self._pipeline.partial and self._tasks:
            result = self._abort()
            if inspect.isawaitable(result):
                await result
            returning = [t for seq, t in self._tasks.items() if seq not in self._carried]
            await asyncio.gather(*returning, return_exceptions=True)
        self._raise_if_failed()

    async def _updated(self, version: int) -> None:
        if self._pipeline.partial and not self._pipeline.paused:
            await self._pause()
        self._pipeline.on_weights_updated(version)
        if self._pipeline.partial and self._resume is not None:
            self._resume()
        self._pump()

    async def _state(self) -> dict:
        source_state = self._source.state_dict() if hasattr(self._source, "state_dict") else None
        return {"pipeline": self._pipeline.state_dict(), "prompt_source": source_state}

    async def _cancel_all(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
