"""``EnginePool`` failover: a request to a dead or hung replica is sent again to a live one,
recorded, never lost; a down replica gets no new requests and its sessions move.

Real servers on loopback: one real embedded rollout engine (tiny model), a port nobody listens
on (a dead engine: connection refused), and a socket that accepts and never answers (a hung
engine, as a SIGSTOPped server looks from outside).
"""

from __future__ import annotations

import asyncio
import socket
import threading

import httpx
import pytest

from loongsage.engines.client import EngineClient
from loongsage.engines.replies import EngineError
from loongsage.engines.pool import EnginePool

SAMPLING = {"max_new_tokens": 4, "temperature": 0.0}


@pytest.fixture
def dead_url():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # closed: nothing listens there



def test_a_dead_replica_is_marked_down_and_its_requests_retried_on_a_live_one(tiny_engine_url, dead_url):
    pool = EnginePool([EngineClient(dead_url), EngineClient(tiny_engine_url)])

    async def many() -> list:
        return await asyncio.gather(*(pool.agenerate([1, 2, 3], SAMPLING, rid=f"r{i}") for i in range(6)))

    outs = asyncio.run(many())
    assert all(len(o.output_ids) == 4 for o in outs)
    retries = pool.take_retries()
    assert 0 in pool.down and "unreachable" in pool.down[0]
    # the first wave goes to both replicas (least loaded); every one sent to the dead one came back
    assert retries and {r.replica for r in retries} == {0}
    assert {r.rid for r in retries} == {o.rid for o in outs if o.meta_info["attempt"] == 2}
    assert pool.take_retries() == []
    # a down replica takes no new requests, nor new sessions; sessions stuck on it move
    out = asyncio.run(pool.agenerate([1, 2, 3], SAMPLING))
    assert out.meta_info["attempt"] == 1 and pool.take_retries() == []
    pool._sticky["s"], pool.sessions[0] = 0, 1
    assert pool.pick("s") == 1 and pool.sessions == [0, 1]


def test_a_batch_goes_to_one_replica_as_one_request_and_fails_over_whole(tiny_engine_url, dead_url):
    """A group's prompts in one request: the dead replica's failure sends the whole batch to the
    live one (one retry recorded, naming the batch), outputs in the order of the rids; the load
    and the served counts are in prompts; a batch held for an update comes back aborted, each."""
    pool = EnginePool([EngineClient(dead_url), EngineClient(tiny_engine_url)])
    rids = ["g-0", "g-1", "g-2"]
    outs = asyncio.run(pool.agenerate_batch([[1, 2, 3], [1, 2, 3], [4, 5]], SAMPLING, rids=rids))
    assert [o.rid for o in outs] == rids and [o.prompt_tokens for o in outs] == [3, 3, 2]
    assert all(len(o.output_ids) == 4 and o.meta_info["attempt"] == 2 for o in outs)
    assert outs[0].output_ids == outs[1].output_ids  # greedy: the same prompt, the same tokens
    assert [(r.rid, r.attempt, r.replica) for r in pool.take_retries()] == [(rid, 1, 0) for rid in rids]
    assert pool.take_served() == [3, 3] and pool.inflight == [0, 0]
    pool.held = True
    held = asyncio.run(pool.agenerate_batch([[1, 2], [1, 2]], SAMPLING, rids=["h-0", "h-1"]))
    assert [(o.rid, o.finish_reason, o.output_ids, o.prompt_tokens) for o in held] == [
        ("h-0", "abort", [], 2), ("h-1", "abort", [], 2)]
    assert pool.take_served() == [0, 0]
    assert asyncio.run(pool.agenerate_batch([], SAMPLING)) == []
    with pytest.raises(ValueError, match="2 prompts but 1 rids"):
        asyncio.run(pool.agenerate_batch([[1], [2]], SAMPLING, rids=["x"]))


def test_a_batch_counts_each_prompt_against_max_inflight(tiny_engine_url):
    """Two batches of 3 on a replica that takes 4 prompts at once: the second waits for the
    first (it cannot take its 3 units while 3 of 4 are held), and neither holds part of its
    units while waiting; a batch larger than the limit takes all of it and still goes."""
    pool = EnginePool([EngineClient(tiny_engine_url)], max_inflight=4)
    order: list[str] = []

    async def batch(name: str, size: int) -> None:
        async with pool.slot(0, prompts=size):
            order.append(f"{name} in")
            await asyncio.sleep(0.2)
            order.append(f"{name} out")

    async def run() -> None:
        await asyncio.gather(batch("a", 3), batch("b", 3), batch("big", 9))

    asyncio.run(run())
    assert order == ["a in", "a out", "b in", "b out", "big in", "big out"]
    assert pool.inflight == [0]


def test_a_hung_replica_marked_down_from_another_thread_loses_no_request(tiny_engine_url, hung_url):
    """The monitor's thread marks the hung replica down; the waiting request goes elsewhere."""
    pool = EnginePool([EngineClient(hung_url, timeout=120), EngineClient(tiny_engine_url)])
    pool.inflight[1] = 5  # make the hung replica the least loaded one

    async def one():
        task = asyncio.ensure_future(pool.agenerate([1, 2, 3], SAMPLING, rid="stuck"))
        await asyncio.sleep(1.0)
        assert not task.done()  # waiting on the hung engine
        threading.Thread(target=pool.mark_down, args=(0, "hung")).start()
        return await asyncio.wait_for(task, 30)

    out = asyncio.run(one())
    assert out.rid == "stuck" and out.meta_info["attempt"] == 2
    assert [(r.rid, r.attempt, r.replica, r.reason) for r in pool.take_retries()] == [("stuck", 1, 0, "hung")]


def test_a_restarted_replica_takes_its_place_and_a_refusal_is_not_retried(tiny_engine_url, dead_url):
    pool = EnginePool([EngineClient(dead_url)], wait_s=30)

    async def during_restart():
        task = asyncio.ensure_future(pool.agenerate([1, 2, 3], SAMPLING, rid="wait"))
        await asyncio.sleep(1.0)
        assert not task.done() and pool.down  # no replica up: the request waits
        pool.replace(0, EngineClient(tiny_engine_url))
        return await asyncio.wait_for(task, 30)

    out = asyncio.run(during_restart())
    assert out.meta_info["attempt"] == 2 and not pool.down
    assert [(r.rid, r.attempt) for r in pool.take_retries()] == [("wait", 1)]
    with pytest.raises(EngineError) as err:  # the engine answered 4xx: the caller's error, sent once
        asyncio.run(pool.agenerate([], SAMPLING))
    assert err.value.status is not None and pool.take_retries() == [] and not pool.down


def test_a_late_failure_of_a_replaced_engine_leaves_the_restarted_one_up(tiny_engine_url, hung_url):
    """A request sent before its engine was restarted fails after the restart (here: timing out
    on the hung one): it is recorded and sent again, but the replica, now the restarted
    engine, stays up; marked down it would take nothing until the monitor's next look."""
    pool = EnginePool([EngineClient(hung_url, timeout=1.5)], wait_s=3)

    async def restart_while_in_flight():
        task = asyncio.ensure_future(pool.agenerate([1, 2, 3], SAMPLING, rid="late"))
        await asyncio.sleep(0.5)
        pool.replace(0, EngineClient(tiny_engine_url))  # the monitor's restart, the request still out
        return await asyncio.wait_for(task, 30)

    out = asyncio.run(restart_while_in_flight())
    assert out.meta_info["attempt"] == 2 and len(out.output_ids) == 4 and not pool.down
    assert [(r.rid, r.attempt, r.replica) for r in pool.take_retries()] == [("late", 1, 0)]


def test_no_replica_up_fails_with_an_error_naming_the_down_ones(dead_url):
    pool = EnginePool([EngineClient(dead_url)], max_attempts=2, wait_s=0.5)
    with pytest.raises(EngineError, match="no rollout engine up for 0 s|failed on 2 replicas"):
        asyncio.run(pool.agenerate([1, 2], SAMPLING, rid="x"))


def test_an_update_abort_marks_an_unreachable_replica_down_and_holds_requests(tiny_engine_url, dead_url):
    """Partial rollout's ``abort_for_update`` aborts the live replica's requests, marks the dead
    one down rather than failing the weight update, and holds new requests until resumed: a
    router turn (``slot``) waits; a white-box request (``agenerate``) returns aborted at once,
    nothing sampled and nothing sent, for its caller to continue under the new weights."""
    pool = EnginePool([EngineClient(dead_url), EngineClient(tiny_engine_url)])

    async def turn():
        async with pool.slot(1) as slot:
            return await slot.client.agenerate([4, 5], SAMPLING)

    async def run():
        long = asyncio.ensure_future(pool.clients[1].agenerate([1, 2, 3], {"max_new_tokens": 1500,
                                                                           "ignore_eos": True}))
        while not (await asyncio.to_thread(httpx.get, tiny_engine_url + "/get_load")).json()["running"]:
            await asyncio.sleep(0.005)
        await pool.abort_for_update()
        sent = pool.served[1]
        white_box = await asyncio.wait_for(pool.agenerate([4, 5], SAMPLING, rid="held"), 5)
        held = asyncio.ensure_future(turn())
        await asyncio.sleep(0.3)
        waited = not held.done()
        pool.resume_after_update()
        turned = await held
        return await long, white_box, pool.served[1] - sent, waited, turned

    aborted, white_box, sent, waited, held = asyncio.run(run())
    assert aborted.finish_reason == "abort" and len(aborted.output_ids) < 1500
    assert 0 in pool.down and "abort at a weight update" in pool.down[0]
    assert (white_box.finish_reason, white_box.output_ids, white_box.rid) == ("abort", [], "held")
    assert white_box.meta_info == {"attempt": 1, "held_for_update": True}
    assert sent == 1  # the router turn, once resumed; the white-box request never reached the engine
    assert waited and held.finish_reason == "length"
    assert pool.update_aborts == 1 and not pool.held and pool.take_retries() == []


def test_a_request_whose_engine_dies_during_an_update_comes_back_aborted(hung_url):
    """A white-box request's engine dies while the pool holds for a weight update (the update's
    abort-all never gets an answer from it; the monitor declares it down): the request is
    recorded as a retry and comes back aborted with nothing sampled, for its group to continue
    after the update. Sent again it would wait for the hold, which ends only once every
    white-box group has returned: the partial-rollout fault test deadlocked there."""
    pool = EnginePool([EngineClient(hung_url, timeout=120)])

    async def run():
        request = asyncio.ensure_future(pool.agenerate([1, 2, 3], SAMPLING, rid="on-dead"))
        await asyncio.sleep(0.5)
        update = asyncio.ensure_future(pool.abort_for_update())
        await asyncio.sleep(0.2)
        assert pool.held and not request.done()
        threading.Thread(target=pool.mark_down, args=(0, "its process is gone")).start()
        try:
            return await asyncio.wait_for(request, 10)
        finally:
            update.cancel()

    out = asyncio.run(run())
    assert (out.rid, out.finish_reason, out.output_ids, out.meta_info) == (
        "on-dead", "abort", [], {"attempt": 2, "held_for_update": True})
    assert [(r.rid, r.attempt, r.replica, r.reason) for r in pool.take_retries()] == [
        ("on-dead", 1, 0, "its process is gone")]
