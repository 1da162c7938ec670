"""The rollout engine's KV cache with spare columns (``slack_cache``): the tiny model decodes a
left-padded batch to bitwise the logits of transformers' ``DynamicCache``; a decode step
writes in place (one reallocation per ``SLACK`` steps, where ``DynamicCache`` copies at every
step); evicting rows moves only the rows that fill finished slots; merging batches keeps the
right numbers, zero padding and spare room."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from loongsage.engines.embedded_rollout.slack_cache import (
    SLACK, SlackLayer, compacting_order, concat_rows, slack_cache)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


def decode(model, cache, steps: int) -> tuple[torch.Tensor, list[list[int]]]:
    """Prefill three left-padded prompts, then greedy-decode ``steps`` tokens; returns the
    logits of every step and, per step, the data pointer of each layer's key buffer."""
    prompts = [[5, 17, 42, 99, 7], [300, 12], [8, 9, 10, 11, 12, 13, 14]]
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):], mask[i, width - len(p):] = torch.tensor(p), 1
    logits, pointers = [], []
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                    cache=cache, use_cache=True)
        for _ in range(steps):
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            positions = mask.sum(-1, keepdim=True)
            mask = torch.cat([mask, mask.new_ones(len(prompts), 1)], dim=-1)
            out = model(input_ids=token, attention_mask=mask, position_ids=positions, cache=cache,
                        use_cache=True)
            logits.append(out.logits[:, -1])
            pointers.append([layer.keys.data_ptr() for layer in cache.layers])
    return torch.stack(logits), pointers


def test_decoding_with_spare_columns_gives_the_logits_of_a_dynamic_cache(model):
    expected, _ = decode(model, DynamicCache(), 2 * SLACK + 5)
    got, _ = decode(model, slack_cache(), 2 * SLACK + 5)
    assert torch.equal(got, expected)


def test_a_decode_step_writes_in_place_until_the_buffer_is_full(model):
    steps = 2 * SLACK + 5
    _, pointers = decode(model, slack_cache(), steps)
    moved = [i for i in range(1, steps) if pointers[i] != pointers[i - 1]]
    # step 0 grows the prefill's exact-size buffer by 1 + SLACK; it is full again after SLACK more
    assert moved == [SLACK + 1, 2 * SLACK + 2]
    _, dynamic = decode(model, DynamicCache(), 4)
    assert all(dynamic[i] != dynamic[i - 1] for i in range(1, 4))  # the copy this avoids


def filled_layer(rows: int, length: int, spare: int) -> SlackLayer:
    """A layer holding ``length`` random columns in a buffer with ``spare`` more."""
    layer = SlackLayer()
    buffer = torch.randn(rows, 2, length + spare, 4)
    layer.keys, layer.values = buffer, -buffer
    layer.is_initialized, layer.length = True, length
    return layer


def test_keeping_rows_moves_only_those_that_change_place_and_keeps_the_spare_room():
    layer = filled_layer(rows=4, length=6, spare=5)
    before, storage = layer.keys.clone(), layer._k.untyped_storage().data_ptr()
    layer.keep(torch.tensor([3, 1]), start=2)
    assert torch.equal(layer.keys, before[[3, 1], :, 2:])
    assert torch.equal(layer.values, -before[[3, 1], :, 2:])
    assert (layer.length, layer.capacity) == (4, 9)
    assert layer._k.untyped_storage().data_ptr() == storage  # row 3 moved into slot 0, no new buffer
    pointer = layer._k.data_ptr()
    layer.update(torch.ones(2, 2, 1, 4), torch.ones(2, 2, 1, 4))
    assert layer._k.data_ptr() == pointer and layer.length == 5
    assert torch.equal(layer.keys[:, :, -1], torch.ones(2, 2, 4))


@pytest.mark.parametrize("alive, order", [
    ([True, False, True, False, True, True], [0, 4, 2, 5]),  # two holes, filled from the end
    ([True, True, False], [0, 1]),  # the last row finished: nothing moves
    ([False, False, True], [2]),
    ([True, True], [0, 1]),
])
def test_a_compacting_order_fills_each_finished_slot_from_the_end(alive, order):
    assert compacting_order(alive) == order
    moved = [i for i, row in enumerate(order) if row != i]
    assert len(moved) == sum(not a for a in alive[:len(order)])  # one copy per hole, no more


def test_merging_batches_left_pads_with_zeros_and_leaves_slack():
    narrow, wide = filled_layer(rows=2, length=3, spare=1), filled_layer(rows=1, length=5, spare=0)
    first, second = slack_cache(), slack_cache()
    first.layers, second.layers = [narrow], [wide]
    merged = concat_rows(first, second, width=5).layers[0]
    assert merged.keys.shape == (3, 2, 5, 4) and merged.capacity == 5 + SLACK
    assert torch.equal(merged.keys[:2, :, :2], torch.zeros(2, 2, 2, 4))
    assert torch.equal(merged.values[:2, :, :2], torch.zeros(2, 2, 2, 4))
    assert torch.equal(merged.keys[:2, :, 2:], narrow.keys)
    assert torch.equal(merged.values[2:], wide.values)
    assert merged.get_seq_length() == 5
