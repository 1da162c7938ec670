"""The base of every agent that talks to the policy through the AgentFlow router.

A router-based agent runs each of a group's ``n`` trajectories against a trajectory of its
own on a router (``/{trajectory_id}/{attempt_id}/v1``), then closes it and returns the
router's TITO samples (one per trainable segment: a subagent or a compacted context is a
sample of its own). Subclasses implement one coroutine::

    async def run_trajectory(self, prompt, urls, key, sampling_params) -> Outcome

where ``urls`` is ``{"openai": ".../v1", "anthropic": "..."}`` and ``key`` the per-trajectory
API key (``"{trajectory_id}:{attempt_id}"``, which the router also accepts without the path).

Which router: the controller hands the agent the run's router for its data source with
``use_router(router)`` (built over the run's engine pool, with ``router_settings(base)``:
the run's ``agentflow`` settings plus what this agent needs). Without one, the agent builds,
on first use, a private router over the engine client it was given in ``run_group`` (an
``EnginePool`` is used as the router's pool; any other client, an ``EngineClient`` or anything
with its ``agenerate``/``astream_generate``/``aabort``, becomes a pool of one), one per
distinct client, and stops them in ``close()``.

The rollout's sampling parameters are enforced by the router on every trained turn
(``params.enforce_sampling``): a CLI's own temperature never reaches the engine, so the
trained tokens come from the distribution the algorithm assumes. The group's
``sampling_params["sampling_seed"]`` (the rollout manager's) gives trajectory ``i`` the seed
``sample_seed(group seed, i)``, which its router trajectory keeps (``metadata["sampling_seed"]``)
and derives each turn's engine seed from, unless the agent's own request carries a ``seed``.

Each sample's ``text`` is the agent's final answer (``Outcome.text``), so the data source's
reward scores it; ``reward_info`` also carries ``Outcome.info`` (exit code, output, ...).
A trajectory that recorded no sampled token (the program died before its first model call)
yields one marked failed sample (``unsampled_sample``): the prompt's rendered tokens, no
response, ``reward_info["failed"]`` naming the exit code, so ``rollout.failed_trajectory``
decides as for a timed-out trajectory (``zero_reward``: reward 0 in its group, nothing to
train on; ``drop_group``: the group again) and the run goes on. Only when *no* trajectory of
the group called the model does ``run_group`` raise, with the first one's details: that is
an agent program that cannot reach the model at all (wrong argv, missing binary, broken
config), which no regeneration fixes and which must not train silently on nothing. A
white-box agent whose call to the router fails on the way (a timeout, a lost connection, the
router's 5xx: ``failed_model_call``) ends that trajectory as failed the same way, with the
turns it recorded, even before its first one; any other exception from ``run_trajectory`` is
the agent's own and ends the run. A failed trajectory is saved with status ``failed`` and
the reason.

Partial rollout (``continues_turns_in_place``): the agent program cannot stop at a weight
update, so it never returns an aborted group; the router continues a turn the engine aborted
for the update from its tokens once the new weights are live (``loongsage.agentflow.turns``),
and the program's request simply takes longer.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from loongsage.plugin import Prompt, SEED_KEY, Sample, sample_seed

from loongsage_agents.agents.router_params import RouterAgentParams
from loongsage_agents.agents.tasks import gather_all

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """What one trajectory's agent run produced besides the router's tokens."""

    text: str = ""
    info: dict[str, Any] = field(default_factory=dict)


def _sample_params(sampling_params: dict[str, Any], index: int) -> dict[str, Any]:
    """The group's sampling parameters with trajectory ``index``'s seed in place of the group's."""
    base = sampling_params.get(SEED_KEY)
    return sampling_params if base is None else {**sampling_params, SEED_KEY: sample_seed(base, index)}


def prompt_task(prompt: Prompt) -> str:
    """The task text of a prompt: its last user message (black-box agents take one string)."""
    for message in reversed(prompt.messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content)
    raise ValueError(f"prompt {prompt.source}#{prompt.index} has no user message: {prompt.messages}")


def described(exc: BaseException) -> str:
    """``Type: message`` (just ``Type`` when the message is empty, as for a cancellation)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def failed_model_call(exc: BaseException, router_url: str) -> bool:
    """Whether ``exc`` is a white-box agent's request to its router (``router_url``) failing on
    the way: the openai or anthropic SDK's connection errors and timeouts
    (``APIConnectionError``, of which ``APITimeoutError`` is one) and the router's 5xx for a
    turn it failed. Such a trajectory fails as one whose turn the router failed does. Anything
    else, a 4xx refusal of a malformed request or the agent's own timeouts and HTTP calls
    included, is the agent's error and ends the run. The SDKs are imported only once a
    trajectory raised."""
    import importlib

    kinds: list[type[BaseException]] = []
    for sdk in ("openai", "anthropic"):
        try:
            module = importlib.import_module(sdk)
        except ImportError:
            continue
        kinds += [module.APIConnectionError, module.InternalServerError]
    if not isinstance(exc, tuple(kinds)):
        return False
    request = getattr(exc, "request", None)
    return request is not None and str(request.url).startswith(router_url)


def trajectory_failure(router: Any, tid: str, outcome: "Outcome") -> str | None:
    """Why trajectory ``tid`` failed, if it did: the agent process timed out (killed with its
    process group), a turn's engine request failed (the router marked it), a white-box
    agent's model call failed (``model_call_failed``: its SDK timed out or lost the
    connection), its sandbox could not run a tool call (``sandbox_failed``: the supervisor
    died), or an environment's episode raised or ran past its deadline (``episode_failed``). The router's own reason comes first: it names the engine's error."""
    traj = router.store.lookup(tid, "0")
    if traj is not None and traj.status == "failed":
        return f"a turn failed: {traj.error}"
    if outcome.info.get("timed_out"):
        return "the agent process timed out and was killed"
    if outcome.info.get("model_call_failed"):
        return f"a model call failed: {outcome.info['model_call_failed']}"
    if outcome.info.get("episode_failed"):
        return f"the environment's episode failed: {outcome.info['episode_failed']}"
    if outcome.info.get("sandbox_failed"):
        return f"its sandbox could not run a tool call: {outcome.info.get('sandbox_error')}"
    return None


def unsampled_sample(router: Any, prompt: Prompt, tid: str, outcome: Outcome,
                     failure: str | None) -> Sample:
    """The marked failed sample of trajectory ``tid``, which recorded no sampled token: the
    prompt's tokens as the router renders them, an empty response, the outcome's info."""
    renderer = router.renderer
    prompt_ids = renderer.encode(renderer.render(prompt.messages, [], generation=True))
    stderr = str(outcome.info.get("stderr") or "").strip()[-300:]
    reason = failure or (f"the agent program ended (exit code {outcome.info.get('exit_code')}) "
                         f"before its first model call{': ' + stderr if stderr else ''}")
    info = {"trajectory_id": tid, "attempt_id": "0", "segment_id": 0, "origin": "root",
            "parent": None, "sampling_overridden_turns": 0, **outcome.info,
            "died_before_model_call": not outcome.info.get("model_call_failed"), "failed": reason}
    return Sample(prompt_ids=prompt_ids, response_ids=[], response_logprobs=[], weight_versions=[],
                  loss_mask=[], text=outcome.text, reward_info=info)


class RouterAgentBase:
    """Runs ``n`` trajectories through a router and returns their TITO samples."""

    params_type: type[RouterAgentParams] = RouterAgentParams
    continues_turns_in_place = True  # partial rollout: the router continues aborted turns

    def __init__(self, params: RouterAgentParams | None, context: Any) -> None:
        self.params = params if params is not None else self.params_type()
        self.context = context
        self.tokenizer = context.tokenizer
        self._shared_router: Any = None
        self._routers: dict[int, Any] = {}

    # ---- routers ------------------------------------------------------------------------
    def use_router(self, router: Any) -> None:
        """Run every trajectory on ``router`` (started), instead of a private one per client."""
        if getattr(router, "url", None) is None:
            raise ValueError("use_router: the router is not started (call router.start() first)")
        self._shared_router = router

    def router_settings(self, base: Any = None) -> Any:
        """``base`` (the run's ``agentflow`` settings, plugins resolved; when None, the config's
        defaults) with what this agent needs: its served and untrained model names, its
        middlewares after the run's (resolved here, from the registries its context lends it:
        they are this agent's parameters, which the router never looks up), its context."""
        import dataclasses

        from loongsage.plugin import RouterSettings, resolve_router_plugins

        p, registries = self.params, self.context.registries
        if base is None:
            base = RouterSettings().with_plugins(resolve_router_plugins(registries))
        own = resolve_router_plugins(registries, None, p.middlewares, f"{self.context.key}.agent.middlewares")
        return dataclasses.replace(
            base.with_plugins(own), served_model_names=list(p.served_model_names),
            accept_any_model=p.accept_any_model, untrained_models=list(p.untrained_models),
            max_context=p.max_context, default_max_tokens=p.default_max_tokens)

    def router_for(self, client: Any) -> Any:
        """The shared router, else this agent's private router over ``client`` (started)."""
        if self._shared_router is not None:
            return self._shared_router
        router = self._routers.get(id(client))
        if router is None:
            from loongsage.plugin import EnginePool, Router

            # the run's pool as it is: wrapped in a pool of its own, its update aborts would not
            # be seen and router turns would end at a weight update instead of continuing
            engines = client if isinstance(client, EnginePool) else [client]
            router = Router(engines, self.tokenizer, self.router_settings())
            router.start()
            self._routers[id(client)] = router
        return router

    def close(self) -> None:
        """Stop the private routers (a shared router belongs to whoever started it)."""
        for router in self._routers.values():
            router.stop()
        self._routers.clear()

    # ---- groups -------------------------------------------------------------------------
    async def run_trajectory(self, prompt: Prompt, urls: dict[str, str], key: str,
                             sampling_params: dict[str, Any]) -> Outcome:
        raise NotImplementedError

    async def _one(self, router: Any, prompt: Prompt, tid: str,
                   sampling_params: dict[str, Any]) -> tuple[list[Sample], Outcome]:
        seed = sampling_params.get(SEED_KEY)
        sampling_params = {k: v for k, v in sampling_params.items() if k != SEED_KEY}
        enforced = dict(sampling_params) if self.params.enforce_sampling else None
        seeded = {} if seed is None else {SEED_KEY: seed}  # the router derives each turn's from it
        router.open_trajectory(tid, "0", sampling=enforced, source=prompt.source,
                               index=prompt.index, **seeded)
        try:
            outcome = await self.run_trajectory(prompt, router.base_urls(tid, "0"), router.trajectory_key(tid, "0"),
                                                dict(sampling_params))
        except Exception as exc:
            if not failed_model_call(exc, router.url):
                router.finish_trajectory(tid, "0", error=f"agent: {described(exc)}")
                raise  # the agent's own error (a bug, a wrong config): the run must not train on it
            log.warning("%s: trajectory %s: a model call failed: %s", type(self).__name__, tid, described(exc))
            outcome = Outcome(info={"model_call_failed": described(exc)})
        except BaseException as exc:  # closed as failed, so the saved line does not read as finished
            router.finish_trajectory(tid, "0", error=f"agent: {described(exc)}")
            raise
        failure = trajectory_failure(router, tid, outcome)
        samples = router.finish_trajectory(tid, "0", error=failure)
        for sample in samples:
            sample.text = outcome.text
            sample.reward_info.update(outcome.info)
            if failure:  # rollout.failed_trajectory decides: reward 0 or the group again
                sample.reward_info["failed"] = failure
        if not samples:
            log.warning("%s: trajectory %s recorded no sampled tokens: %s",
                        type(self).__name__, tid, outcome.info)
            samples = [unsampled_sample(router, prompt, tid, outcome, failure)]
        return samples, outcome

    async def run_group(self, prompt: Prompt, n: int, client: Any,
                        sampling_params: dict[str, Any]) -> list[Sample]:
        """Run ``n`` trajectories of ``prompt`` (at most ``params.concurrency`` at once)."""
        if n < 1:
            raise ValueError(f"{type(self).__name__}: n must be >= 1, got {n}")
        router = self.router_for(client)
        group = uuid.uuid4().hex[:8]
        limit = asyncio.Semaphore(self.params.concurrency or n)

        async def bounded(i: int):
            async with limit:
                return await self._one(router, prompt, f"{prompt.source}-{prompt.index}-{group}-{i}",
                                       _sample_params(sampling_params, i))

        tasks = [asyncio.ensure_future(bounded(i)) for i in range(n)]
        results = await gather_all(tasks)
        samples = [s for got, _ in results for s in got]
        if all(s.reward_info.get("died_before_model_call") for s in samples):
            raise RuntimeError(f"{type(self).__name__}: none of the {n} trajectories of prompt "
                               f"{prompt.source}#{prompt.index} called the model; first outcome: "
                               f"{asdict(results[0][1])}")
        return samples
