"""Per-request randomness in the embedded rollout engine (``engines.sampling_seed``): a request
samples the same tokens decoded alone, in a batch of 32 mixed requests (other prompts, seeds,
temperatures, top-k/top-p, lengths, arriving before and after it) and after the engine is
restarted. With one ``torch.Generator`` per engine (before) each of these changed the tokens.

Real engines on the tiny model over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from loongsage.engines.client import EngineClient
from loongsage.engines.replies import EngineError
from loongsage.engines.embedded_rollout import EmbeddedRolloutEngine
from loongsage.engines.pool import EnginePool
from loongsage.engines.sampling_seed import derive_seed, sample_seed, token_uniform

PROMPT = [5, 17, 42, 99, 7]
PARAMS = {"max_new_tokens": 24, "temperature": 1.0, "ignore_eos": True}


def start(model_dir) -> EmbeddedRolloutEngine:
    engine = EmbeddedRolloutEngine(str(model_dir), max_running_requests=64, seed=11, num_threads=1)
    engine.start()
    return engine


def mixed_batch(target: dict) -> list[tuple[list[int], dict, str]]:
    """32 requests: 31 others (varied prompts, seeds, settings, lengths) and ``target`` at 17."""
    batch = []
    for i in range(31):
        params = {"max_new_tokens": 4 + i % 9, "temperature": [1.0, 0.7, 1.3][i % 3], "ignore_eos": True,
                  "top_k": [-1, 20][i % 2], "top_p": [1.0, 0.9][i // 2 % 2], "sampling_seed": 1000 + i}
        batch.append(([3 + i, 40 + 2 * i, 7, 250 - i][: 1 + i % 4], params, f"other-{i}"))
    batch.insert(17, (PROMPT, target, "target"))
    return batch


async def run_batch(client: EngineClient, batch) -> list[list[int]]:
    outs = await asyncio.gather(*(client.agenerate(p, sp, rid=rid) for p, sp, rid in batch))
    return [o.output_ids for o in outs]


def test_the_uniforms_depend_only_on_seed_and_position_and_cover_the_unit_interval():
    draws = [token_uniform(7, pos) for pos in range(20000)]
    assert draws == [token_uniform(7, pos) for pos in range(20000)]
    assert all(0.0 <= u < 1.0 for u in draws)
    assert abs(sum(draws) / len(draws) - 0.5) < 0.01
    assert sum(u < 0.1 for u in draws) / len(draws) == pytest.approx(0.1, abs=0.01)
    assert draws[:50] != [token_uniform(8, pos) for pos in range(50)]
    assert len({sample_seed(derive_seed(0, 3, "math", 12, 1), i) for i in range(64)}) == 64


def test_derived_seeds_are_the_same_in_another_process():
    """``hash()`` is salted per process; the seed a run derives must not be."""
    code = ("from loongsage.engines.sampling_seed import derive_seed;"
            "print(derive_seed(0, 3, 'math', 12, 1))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123"})
    assert int(other.stdout) == derive_seed(0, 3, "math", 12, 1)


def test_a_request_samples_the_same_tokens_alone_in_a_batch_of_32_and_after_a_restart(tiny_model_dir):
    seeded = {**PARAMS, "sampling_seed": 424242}
    engine = start(tiny_model_dir)
    try:
        with EngineClient(engine.url, timeout=300) as client:
            alone = client.generate(PROMPT, seeded).output_ids
            unseeded_alone = client.generate(PROMPT, PARAMS, rid="fixed-rid").output_ids
            batched = asyncio.run(run_batch(client, mixed_batch(seeded)))
            # again, after the engine has sampled hundreds of tokens for others
            again = client.generate(PROMPT, seeded).output_ids
            unseeded_batched = asyncio.run(run_batch(client, [(PROMPT, PARAMS, "fixed-rid")]
                                                     + mixed_batch(seeded)[:31]))[0]
            other_seed = client.generate(PROMPT, {**PARAMS, "sampling_seed": 424243}).output_ids
            # one batched /generate through the pool, one sampling_params per prompt (a group's form)
            group = asyncio.run(EnginePool([client]).agenerate_batch(
                [PROMPT, PROMPT], [{**PARAMS, "sampling_seed": 424243}, seeded], rids=["g0", "g1"]))
            with pytest.raises(EngineError, match="sampling_seed"):
                client.generate(PROMPT, {**PARAMS, "sampling_seed": -1})
    finally:
        engine.stop()
    assert len(alone) == 24
    assert batched[17] == alone
    assert again == alone
    assert unseeded_batched == unseeded_alone  # no seed: the engine's seed and the rid decide
    assert other_seed != alone
    assert [o.output_ids for o in group] == [other_seed, alone]
    assert len(set(map(tuple, batched))) > 25  # the others drew their own tokens

    restarted = start(tiny_model_dir)
    try:
        with EngineClient(restarted.url, timeout=300) as client:
            after_restart = client.generate(PROMPT, seeded).output_ids
    finally:
        restarted.stop()
    assert after_restart == alone
