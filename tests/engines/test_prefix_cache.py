"""The embedded engine's prefix cache (``engines.embedded_rollout.prefix_cache``).

The radix tree on its own (longest-prefix match inside an edge, splits, LRU eviction of leaves,
entries never written by the batch they came from), then the engine over real HTTP: a request
served from the cache (a later turn, a group's sample sent alone, a batch mixing cached and
fresh prompts) samples the same tokens with log-probs within 1e-5 of a cold prefill (fp32), on
every layer type the engine runs (dense, MoE with its routed experts, sliding window); eviction
under a tiny budget; a weight update clears the cache unless ``keep_on_update``; the counts.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from loongsage.engines.client import EngineClient
from loongsage.engines.embedded_rollout.prefix_cache import GiB, PrefixCache, Segment
from loongsage.models.tiny import TINY_ARCH, save_seeded_model

SAMPLING = {"max_new_tokens": 6, "temperature": 1.0, "ignore_eos": True}
PROMPT = [int(t) for t in np.random.default_rng(0).integers(20, 400, size=40)]
BYTES_PER_TOKEN = 4 * 2 * 2 * 64 * 4  # tiny Qwen2: layers x (K, V) x kv heads x head dim x fp32


def segment(tokens: list[int]) -> Segment:
    """Fake KV for ``tokens``: one layer whose every value is the token id."""
    t = torch.tensor(tokens, dtype=torch.float32).view(1, -1, 1)
    return Segment([t.clone()], [t.clone()])


def flat(hit, which: str = "keys") -> list[float]:
    """A match's tokens (the fake KV values), part after part."""
    return [x for part in hit.parts for x in getattr(part, which)[0].flatten().tolist()]


def take_from(tokens: list[int]):
    full = segment(tokens)
    return lambda start, end: full.cut(start, end)


def test_match_returns_the_longest_prefix_and_splits_edges():
    cache = PrefixCache(1 << 20)
    assert cache.insert([1, 2, 3, 4, 5], take_from([1, 2, 3, 4, 5])) == 5
    assert cache.insert([1, 2, 3, 9], take_from([1, 2, 3, 9])) == 1  # splits after 1 2 3
    hit = cache.match([1, 2, 3, 4, 7])
    assert hit.length == 4 and flat(hit) == [1, 2, 3, 4]
    assert [x for part in hit.head(2) for x in part.keys[0].flatten().tolist()] == [1, 2]
    assert flat(cache.match([1, 2, 3, 9, 9]), "values") == [1, 2, 3, 9]
    assert cache.match([2, 1]).length == 0 and cache.match([2, 1]).parts == []
    assert cache.tokens == 6 and cache.nbytes == 6 * 2 * 4
    assert cache.stats["hit_tokens"] == 4 + 4 and cache.stats["inserted_tokens"] == 6


def test_an_entry_is_a_copy_of_the_batch_it_came_from():
    cache = PrefixCache(1 << 20)
    source = segment([1, 2, 3])
    cache.insert([1, 2, 3], lambda start, end: source.cut(start, end))
    source.keys[0].fill_(-1)  # the batch the entry came from goes on writing its buffer
    assert flat(cache.match([1, 2, 3])) == [1, 2, 3]


def test_eviction_drops_least_recently_used_leaves_first():
    cache = PrefixCache(10 * 8)  # ten tokens of one fp32 layer (K and V)
    cache.insert([1, 2, 3, 4], take_from([1, 2, 3, 4]))
    cache.insert([1, 2, 5, 6], take_from([1, 2, 5, 6]))  # shares 1 2: 6 tokens kept
    cache.match([1, 2, 3, 4])  # 3 4 is now more recent than 5 6
    cache.insert([7, 8, 9, 10], take_from([7, 8, 9, 10]))  # 10 tokens: fits
    assert cache.tokens == 10
    cache.insert([11, 12], take_from([11, 12]))  # over: the LRU leaf (5 6) goes
    assert cache.match([1, 2, 5, 6]).length == 2 and cache.match([1, 2, 3, 4]).length == 4
    assert cache.tokens == 10 and cache.nbytes <= cache.budget_bytes
    assert cache.stats["evicted_tokens"] == 2
    cache.clear()
    assert (cache.tokens, cache.nbytes, cache.match([1, 2]).length) == (0, 0, 0)



def test_dropped_entries_are_freed_without_a_garbage_collection():
    """Clearing or evicting frees an entry's tensors at once: nothing but the tree holds them
    and the tree has no reference cycle (with parent links held strongly a cleared tree waited
    for Python's next full collection, and a long-lived engine's memory grew step after step)."""
    import gc
    import weakref

    def kept(cache):
        return [weakref.ref(t) for node in cache._leaves() for t in node.data.keys + node.data.values]

    gc.disable()
    try:
        cache = PrefixCache(10 * 8)  # ten tokens of one fp32 layer (K and V)
        cache.insert([1, 2, 3, 4, 5], take_from([1, 2, 3, 4, 5]))
        cache.insert([1, 2, 3, 9], take_from([1, 2, 3, 9]))  # a split: inner node 1 2 3
        evicted = kept(cache)
        cache.match([1, 2, 3, 9])
        cache.insert([20, 21, 22, 23, 24], take_from([20, 21, 22, 23, 24]))  # 4 5 goes
        assert cache.tokens == 9 and sum(r() is not None for r in evicted) == 2  # 9's tensors
        cleared = kept(cache)
        cache.clear()
        assert [r() for r in evicted + cleared] == [None] * len(evicted + cleared)
    finally:
        gc.enable()

@pytest.fixture(scope="module")
def sliding_dir(tmp_path_factory):
    """The tiny Qwen2 (same seed and weights) with sliding-window attention (8 tokens) in
    three of its four layers."""
    arch = {**TINY_ARCH, "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}
    return save_seeded_model(tmp_path_factory.mktemp("sliding"), Qwen2ForCausalLM, Qwen2Config, arch)


@pytest.fixture(scope="module")
def model_dirs(tiny_model_dir, sliding_dir):
    from loongsage.models.resolve import resolve_model_path

    return {"dense": tiny_model_dir, "moe": resolve_model_path("builtin:tiny_moe"), "sliding": sliding_dir}


def script(client: EngineClient) -> list:
    """Three turns of one trajectory, a group's samples sent one by one, then one batched
    request mixing cached prefixes (one ending inside an edge) with uncached suffixes of
    different lengths and a fresh prompt."""
    sp = lambda seed: {**SAMPLING, "sampling_seed": seed}  # noqa: E731
    first = client.generate(PROMPT, sp(1), return_logprob=True)
    turn2 = PROMPT + first.output_ids + [11, 12, 13, 14, 15]
    second = client.generate(turn2, sp(2), return_logprob=True)
    turn3 = turn2 + second.output_ids + [21, 22, 23]
    third = client.generate(turn3, sp(3), return_logprob=True)
    group = [client.generate(PROMPT, sp(seed), return_logprob=True) for seed in (4, 5)]
    mixed = asyncio.run(client.agenerate_batch(
        [turn3 + [31], list(range(100, 130)), PROMPT[:20] + [7], turn2 + [40, 41, 42, 43, 44, 45]], sp(6)))
    inside = client.generate(PROMPT[:20] + [7, 8], sp(7), return_logprob=True)
    return [first, second, third, *group, *mixed, inside]


def run_script(running_engine, path, **options) -> tuple[list, dict]:
    with running_engine(path, **options) as engine:
        with EngineClient(engine.url, timeout=120, return_routed_experts="moe" in str(path)) as client:
            outs = script(client)
        return outs, engine.scheduler.load()


@pytest.mark.parametrize("kind", ["dense", "moe", "sliding"])
def test_cached_requests_equal_a_cold_prefill(kind, model_dirs, running_engine):
    path = model_dirs[kind]
    cold, cold_stats = run_script(running_engine, path, prefix_cache_gb=0)
    warm, stats = run_script(running_engine, path, prefix_cache_gb=0.01)
    assert "prefix_cache_tokens" not in cold_stats and cold_stats["prefill_tokens_cached"] == 0
    for c, w in zip(cold, warm):
        assert w.output_ids == c.output_ids
        assert np.abs(np.subtract(w.output_logprobs, c.output_logprobs)).max() <= 1e-5
        if kind == "moe":
            assert np.array_equal(w.routed_experts, c.routed_experts)
            assert (w.routed_experts[:-1] >= 0).all()  # every consumed token has its routes
    first, second, third, g1, g2, *mixed, inside = warm
    n = len(PROMPT)
    assert [o.meta_info["cached_tokens"] for o in cold] == [0] * len(cold)
    assert second.meta_info["cached_tokens"] == n + SAMPLING["max_new_tokens"] - 1  # all fed so far
    assert third.meta_info["cached_tokens"] == second.prompt_tokens + SAMPLING["max_new_tokens"] - 1
    assert (g1.meta_info["cached_tokens"], g2.meta_info["cached_tokens"]) == (n - 1, n - 1)
    # the fresh prompt is prefilled apart; the others continue their cached prefixes in one
    # forward that feeds every row the longest uncached suffix (6 tokens), right-aligned
    assert [o.meta_info["cached_tokens"] for o in mixed] == [third.prompt_tokens + 1 - 6, 0, 21 - 6,
                                                              second.prompt_tokens]
    assert inside.meta_info["cached_tokens"] == 21  # PROMPT[:20] + [7], kept by the batch above
    assert stats["prefills"] == cold_stats["prefills"] + 1
    cached = sum(o.meta_info["cached_tokens"] for o in warm)
    assert stats["prefill_tokens_cached"] == cached <= stats["prefix_cache_hit_tokens"]  # hits a batch could use
    assert stats["prefill_tokens"] == cold_stats["prefill_tokens"]


def hf_logprobs(path, prompt: list[int], output: list[int]) -> np.ndarray:
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        lp = model(torch.tensor([prompt + output])).logits.float().log_softmax(-1)[0]
    return np.array([lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(output)])


def test_sliding_window_is_in_force_and_the_engine_matches_hf(model_dirs, running_engine):
    """The sliding-window case above tests something: the window changes the log-probs of a
    prompt longer than it, and the cached engine's equal an unbatched HF forward's."""
    sliding, _ = run_script(running_engine, model_dirs["sliding"], prefix_cache_gb=0.01)
    third = sliding[2]
    prompt = PROMPT + sliding[0].output_ids + [11, 12, 13, 14, 15] + sliding[1].output_ids + [21, 22, 23]
    hf = hf_logprobs(model_dirs["sliding"], prompt, third.output_ids)
    assert np.abs(hf - third.output_logprobs).max() <= 1e-4
    dense = hf_logprobs(model_dirs["dense"], prompt, third.output_ids)
    assert np.abs(dense - third.output_logprobs).max() > 1e-2


def test_a_tiny_budget_evicts_the_least_recently_used_prefix(tiny_model_dir, running_engine):
    budget = 60 * BYTES_PER_TOKEN  # one 40-token prompt and its reply fit, two do not
    other = [t + 1 for t in PROMPT]
    sp = {**SAMPLING, "sampling_seed": 1}
    with running_engine(tiny_model_dir, prefix_cache_gb=budget / GiB) as engine:
        with EngineClient(engine.url, timeout=120) as client:
            client.generate(PROMPT, sp)
            client.generate(other, sp)  # PROMPT's entry is evicted for it
            again_other = client.generate(other, sp)
            again_prompt = client.generate(PROMPT, sp)
        stats = engine.scheduler.load()
    assert again_other.meta_info["cached_tokens"] == len(other) - 1
    assert again_prompt.meta_info["cached_tokens"] == 0
    kept = len(PROMPT) + SAMPLING["max_new_tokens"] - 1
    assert stats["prefix_cache_tokens"] == kept and stats["prefix_cache_evicted_tokens"] == 2 * kept
    assert stats["prefix_cache_bytes"] == kept * BYTES_PER_TOKEN <= budget


def perturbed(path) -> dict[str, torch.Tensor]:
    state = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).state_dict()
    name = "model.layers.0.self_attn.v_proj.weight"
    return {name: state[name] * 1.5}


@pytest.mark.parametrize("keep", [False, True])
def test_a_weight_update_clears_the_cache_unless_kept(keep, tiny_model_dir, running_engine):
    """A weight update invalidates the cache: the request after it is computed cold and equals
    a fresh engine's under the new weights. With ``keep_on_update`` it is served from KV of the
    old weights, and its log-probs show the mismatch."""
    sp = {**SAMPLING, "sampling_seed": 1}
    new = perturbed(tiny_model_dir)
    with running_engine(tiny_model_dir, prefix_cache_gb=0.05, keep_prefix_cache_on_update=keep) as engine:
        with EngineClient(engine.url, timeout=120) as client:
            client.generate(PROMPT, sp)
            engine.apply_weights(new)
            after = client.generate(PROMPT, sp, return_logprob=True)
        stats = engine.scheduler.load()
    with running_engine(tiny_model_dir, prefix_cache_gb=0) as engine:
        engine.apply_weights(new)
        with EngineClient(engine.url, timeout=120) as client:
            fresh = client.generate(PROMPT, sp, return_logprob=True)
    gap = np.abs(np.subtract(after.output_logprobs, fresh.output_logprobs)).max()
    if keep:
        assert after.meta_info["cached_tokens"] == len(PROMPT) - 1 and stats["prefix_cache_clears"] == 0
        assert gap > 1e-3
    else:
        assert after.meta_info["cached_tokens"] == 0 and stats["prefix_cache_clears"] == 1
        assert gap <= 1e-5 and after.output_ids == fresh.output_ids



@pytest.mark.parametrize("keep", [False, True])
def test_handing_the_device_to_the_trainer_drops_the_cache_unless_kept(keep, tiny_model_dir, running_engine):
    """Colocated, the engine offloads before the train phase: the cache the next weight update
    would clear is freed then rather than held through the trainer's peak (on CPU too, where
    the weights do not move); with ``keep_on_update`` it stays."""
    with running_engine(tiny_model_dir, prefix_cache_gb=0.05, keep_prefix_cache_on_update=keep) as engine:
        with EngineClient(engine.url, timeout=120) as client:
            client.generate(PROMPT, SAMPLING)
            held = engine.scheduler.load()["prefix_cache_tokens"]
            assert engine.offload() is False and engine.onload() is False  # CPU: nothing moves
            left = engine.scheduler.load()["prefix_cache_tokens"]
            again = client.generate(PROMPT, SAMPLING)
    assert held == len(PROMPT) + SAMPLING["max_new_tokens"] - 1
    assert left == (held if keep else 0)
    assert again.meta_info["cached_tokens"] == (len(PROMPT) - 1 if keep else 0)

def test_flush_cache_empties_it_when_idle(tiny_model_dir, running_engine):
    with running_engine(tiny_model_dir, prefix_cache_gb=0.05) as engine:
        with EngineClient(engine.url, timeout=120) as client:
            client.generate(PROMPT, SAMPLING)
            assert engine.scheduler.load()["prefix_cache_tokens"] > 0
            assert client.flush_cache()
            assert client.generate(PROMPT, SAMPLING).meta_info["cached_tokens"] == 0


@pytest.mark.parametrize("overrides, key, text", [
    (["rollout.prefix_cache_gb=-1"], "rollout.prefix_cache_gb", ">= 0 GiB"),
    (["rollout.backend=sglang", "rollout.prefix_cache.keep_on_update=true"],
     "rollout.prefix_cache.keep_on_update", "embedded engine only"),
])
def test_bad_settings_are_refused_naming_the_key(overrides, key, text):
    from loongsage.config.compose import load_config
    from loongsage.errors import ConfigError

    with pytest.raises(ConfigError, match=text) as err:
        load_config("tiny/grpo", overrides)
    assert err.value.key == key


def test_the_config_reaches_the_engine(tiny_model_dir):
    from loongsage.config.compose import load_config
    from loongsage.engines.embedded_rollout import EmbeddedRolloutEngine

    cfg = load_config("tiny/grpo", [f"model.path={tiny_model_dir}", "rollout.prefix_cache_gb=0.5",
                                    "rollout.prefix_cache.keep_on_update=true"]).cfg
    engine = EmbeddedRolloutEngine.from_config(cfg)
    assert engine.scheduler.prefix_cache.budget_bytes == GiB // 2
    assert engine.scheduler.keep_prefix_cache_on_update
    off = EmbeddedRolloutEngine.from_config(load_config("tiny/grpo", [f"model.path={tiny_model_dir}",
                                                                      "rollout.prefix_cache_gb=0"]).cfg)
    assert off.scheduler.prefix_cache is None


def test_an_aborted_request_is_continued_from_the_cache(tiny_model_dir, running_engine):
    """Partial rollout: a turn aborted mid-generation (for a weight update) has put every token
    it fed in the cache, so its continuation (prompt + tokens so far) prefills one token; with
    ``keep_on_update`` that holds across the update too."""
    with running_engine(tiny_model_dir, prefix_cache_gb=0.05, keep_prefix_cache_on_update=True) as engine:
        with EngineClient(engine.url, timeout=120) as client:

            async def aborted():
                task = asyncio.ensure_future(client.agenerate(
                    PROMPT, {**SAMPLING, "max_new_tokens": 2000, "sampling_seed": 1}, rid="long"))
                while engine.scheduler.load()["decode_steps"] < 5:
                    await asyncio.sleep(0.01)
                await client.aabort("long")
                return await task

            out = asyncio.run(aborted())
            engine.apply_weights(perturbed(tiny_model_dir))
            continued = client.generate(PROMPT + out.output_ids, SAMPLING)
    assert out.finish_reason == "abort" and len(out.output_ids) >= 5
    assert continued.meta_info["cached_tokens"] == len(PROMPT) + len(out.output_ids) - 1
