"""512 concurrent router sessions while a rollout engine is SIGKILLed and restarted.

Real components: the run's own pieces, built in this process on a local Ray cluster
(``build_run``, the tiny recipe with two rollout engines: a train rank, two embedded engines
as Ray actors, TransferMesh, the controller's ``EnginePool`` and its ``EngineMonitor``), the
real AgentFlow router over that pool as the controller builds one, and the real ``openai``
async client (one session per trajectory, half of them streamed, ``max_tokens`` 8). Once 64
sessions have their reply and engine 0 serves others, its process is SIGKILLed; the monitor
restarts it in its bundle with the current weights (the controller's restart path).

Checked: every session gets a well-formed completion (no error, all within the bound);
every trajectory is either complete with token-exact records (the reply is its sampled
tokens decoded, the engine's logprobs and the run's weight version on each) or marked
failed with its reason, counted; the turns that were on the dead engine were continued
elsewhere, each one attempt in the pool's retry record (``engine_events.jsonl``) and in its
trajectory; the restart is recorded; no engine request is left running; and no process of
the run (the killed engine, the restarted one, the others) outlives it.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import time

import httpx
import pytest

from loongsage.controller.engine_health import process_state

ray = pytest.importorskip("ray")
openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.slow, pytest.mark.serial]

SESSIONS = 512
MAX_TOKENS = 8
KILL_AFTER = 64  # replies in before engine 0 is killed
BOUND_S = 240  # every session has its reply within this, restart included

OVERRIDES = ["rollout.num_engines=2", "trainer.steps=1", "trainer.sft.steps=0", "checkpoint.interval=0",
             "logging.progress_bar=false", "logging.trackers=[]", "placement.train_cpus=0.5",
             "placement.rollout_cpus=0.5", "train.num_threads=1", "rollout.num_threads=1",
             "rollout.health.interval_s=1.0",
             "placement.share_process=false"]  # engine 0 an actor of its own, to kill and restart alone


@pytest.fixture
def spec(tmp_path, monkeypatch):
    """The tiny recipe with two rollout engines, its Ray cluster shut down after the test."""
    from loongsage.config.compose import load_config

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    yield load_config("tiny/grpo", [*OVERRIDES, f"trainer.run_dir={tmp_path / 'run'}"])
    if ray.is_initialized():
        ray.shutdown()


def actor_pids(run) -> list[int]:
    return [ray.get(a.where.remote())["pid"] for a in [*run.trainers.actors, *run.rollout_actors]]


async def session(client, i: int) -> tuple[str, str, float]:
    """One agent turn; (reply text, finish reason, when it ended)."""
    kwargs = dict(model="policy", max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": f"Count to {i}"}])
    if i % 2 == 0:
        out = await client.chat.completions.create(**kwargs)
        return out.choices[0].message.content, out.choices[0].finish_reason, time.time()
    text, finish = "", None
    async for chunk in await client.chat.completions.create(**kwargs, stream=True):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish, time.time()


async def sessions_through_a_kill(router, pool, victim_pid: int) -> tuple[list, float]:
    """Every session's (text, finish, when) or exception, and when engine 0 was killed."""
    killed_at = []
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=SESSIONS + 16), timeout=BOUND_S) as http:
        clients = [openai.AsyncOpenAI(base_url=router.base_urls(f"s{i}")["openai"], api_key="x",
                                      max_retries=0, http_client=http) for i in range(SESSIONS)]
        tasks = [asyncio.ensure_future(session(c, i)) for i, c in enumerate(clients)]

        async def kill() -> None:
            while sum(t.done() for t in tasks) < KILL_AFTER or pool.inflight[0] == 0:
                assert not all(t.done() for t in tasks), "every session ended before the kill"
                await asyncio.sleep(0.01)
            os.kill(victim_pid, signal.SIGKILL)
            killed_at.append(time.time())

        await asyncio.wait_for(kill(), BOUND_S)
        done, pending = await asyncio.wait(tasks, timeout=BOUND_S)
        assert not pending, f"{len(pending)} sessions had no reply within {BOUND_S} s"
    return [t.result() if t.exception() is None else t.exception() for t in tasks], killed_at[0]


def test_512_sessions_through_an_engine_restart(spec):
    from loongsage.agentflow.server import Router
    from loongsage.agentflow.settings import RouterSettings
    from loongsage.controller.build import build_run

    with build_run(spec) as run:
        pool, monitor, tokenizer = run.rollout.pool, run.engine_monitor, run.tokenizer
        router = Router(pool, tokenizer, RouterSettings.from_config(
            run.cfg.agentflow, run.spec.router, run_dir=str(run.run_dir.path / "trajectories")))
        router.start()
        pids = actor_pids(run)
        victim = monitor.pids[0]
        try:
            figures = check_sessions_through_a_restart(run, router, victim)
        finally:
            router.stop()
        pids.append(monitor.pids[0])  # the restarted engine
    ray.shutdown()
    deadline = time.monotonic() + 60
    while any(process_state(p) != "gone" for p in pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert [p for p in pids if process_state(p) != "gone"] == []  # no process of the run outlives it
    print(json.dumps(figures))


def check_sessions_through_a_restart(run, router, victim: int) -> dict:
    pool, monitor, tokenizer = run.rollout.pool, run.engine_monitor, run.tokenizer
    for i in range(SESSIONS):
        router.open_trajectory(f"s{i}")
    start = time.monotonic()
    replies, killed_at = asyncio.run(sessions_through_a_kill(router, pool, victim))
    elapsed = time.monotonic() - start
    errors = [r for r in replies if isinstance(r, BaseException)]
    assert errors == [], errors[:3]
    deadline = time.monotonic() + 120
    while monitor.restarts == 0 or pool.down:  # restarted, and back in the pool
        assert time.monotonic() < deadline, f"engine 0 was not restarted (down: {pool.down})"
        time.sleep(0.2)

    completed = failed = continued = 0
    for i, (text, finish, _) in enumerate(replies):
        traj = router.store.lookup(f"s{i}")
        if traj.status == "failed":  # marked, with its reason
            assert traj.error and sum(traj.loss_mask) == 0
            failed += 1
            continue
        assert traj.status == "active" and finish in ("length", "stop")
        sampled = [p for p, m in enumerate(traj.loss_mask) if m]
        assert 1 <= len(sampled) <= MAX_TOKENS and (finish != "length" or len(sampled) == MAX_TOKENS)
        assert sampled == list(range(sampled[0], sampled[0] + len(sampled)))
        assert text == tokenizer.decode([traj.tokens[p] for p in sampled], skip_special_tokens=True)
        assert all(math.isfinite(traj.logprobs[p]) and traj.logprobs[p] <= 0 for p in sampled)
        assert {traj.versions[p] for p in sampled} == {run.version}
        failovers = traj.metadata.get("turn_failovers", [])
        assert traj.metadata.get("turn_retries", 0) == len(failovers)
        assert all(f["replica"] == 0 and f["attempt"] == 1 for f in failovers)
        continued += len(failovers)
        completed += 1
    assert (completed, failed) == (SESSIONS, 0)
    assert continued > 0  # the kill landed on turns in flight, and they were continued

    metrics = monitor.metrics()  # writes the pool's retries to engine_events.jsonl
    assert metrics["rollout/engine_retries"] == continued and metrics["rollout/engine_restarts"] == 1
    events = [json.loads(line) for line in (run.run_dir.path / "engine_events.jsonl").read_text().splitlines()]
    restart, = [e for e in events if e["event"] == "restart"]
    assert (restart["replica"], restart["reason"], restart["weight_version"]) == (0, "its process is gone",
                                                                                 run.version)
    assert len([e for e in events if e["event"] == "retry"]) == continued
    # nothing is left running: neither in the pool's counts nor at either engine
    assert pool.inflight == [0, 0]
    for client in pool.clients:
        load = httpx.get(client.base_url + "/get_load", timeout=10).json()
        assert load["running"] == load["waiting"] == 0, load
    assert process_state(victim) == "gone"
    return {"sessions": SESSIONS, "completed": completed, "failed": failed, "turns_continued": continued,
            "restart_s": restart["seconds"], "sessions_s": round(elapsed, 1),
            "restarted_after_kill_s": round(restart["time"] - killed_at, 1),
            "last_reply_after_kill_s": round(max(r[2] for r in replies) - killed_at, 1),
            "replies_before_restart": sum(r[2] < restart["time"] for r in replies)}
