"""A KV cache whose layers grow into spare columns instead of being copied at every token.

transformers' ``DynamicLayer`` appends a decode step's key/value with ``torch.cat``: every step
copies the whole cache of every layer (for SmolLM2 at 32 rows x 150 tokens, ~220 MB a step,
a sizeable share of the weights' 540 MB that the step has to read anyway). A ``SlackLayer``
keeps its keys and values in a buffer with ``SLACK`` unused columns at the end: a step writes
its column in place, and attention reads a view of the filled columns (SDPA takes strided
keys, so nothing is copied). The buffer is reallocated, with fresh slack, only when it is
full, i.e. once every ``SLACK`` steps. Dropping finished rows moves only the rows that fill
their slots, in the same buffer. SGLang and vLLM avoid the copy the same way, with a
paged pool instead of one buffer per layer.

Logits are bitwise the same as with ``DynamicLayer`` (the attention reads the same numbers in
the same order; ``tests/engines/test_slack_cache.py`` checks it). The cost is memory: up to
``SLACK`` spare columns per row (SmolLM2: 46 KB per row and column, so 32 columns x 64 rows
is ~94 MB at most), and the rows and columns an eviction drops stay allocated until the
buffer is next reallocated or merged (at most ``SLACK`` steps later).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers.cache_utils import Cache, DynamicLayer

if TYPE_CHECKING:
    from loongsage.engines.embedded_rollout.prefix_cache import Segment

SLACK = 32  # spare columns a full buffer is reallocated with


class SlackLayer(DynamicLayer):
    """One layer's keys/values: the first ``length`` columns of a larger buffer."""

    def __init__(self) -> None:
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self.length = 0
        super().__init__()

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._k is None else self._k[:, :, :self.length]

    @keys.setter
    def keys(self, tensor: torch.Tensor | None) -> None:
        """Replace the keys (an index-select, a trim): the buffer becomes ``tensor`` itself."""
        self._k = tensor
        self.length = 0 if tensor is None or tensor.dim() < 3 else tensor.shape[-2]

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._v is None else self._v[:, :, :self.length]

    @values.setter
    def values(self, tensor: torch.Tensor | None) -> None:
        self._v = tensor

    @property
    def capacity(self) -> int:
        return 0 if self._k is None else self._k.shape[-2]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.is_initialized, self.device = True, key_states.device
            self.keys, self.values = key_states, value_states
            return self.keys, self.values
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            self._grow(end + SLACK)
        self._k[:, :, self.length:end] = key_states
        self._v[:, :, self.length:end] = value_states
        self.length = end
        return self.keys, self.values

    def _grow(self, capacity: int) -> None:
        shape = list(self._k.shape)
        shape[-2] = capacity
        keys, values = self._k.new_empty(shape), self._v.new_empty(shape)
        keys[:, :, :self.length] = self.keys
        values[:, :, :self.length] = self.values
        self._k, self._v = keys, values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def keep(self, rows: torch.Tensor, start: int) -> None:
        """Row ``i`` becomes row ``rows[i]`` (at most as many rows as now), columns from ``start``
        on. Only rows that change place are copied; the rest, the trim and the spare columns are
        a view of the same buffer, so a compacting ``rows`` (``compacting_order``) copies one row
        per finished row and the next steps still write in place."""
        moved = (rows != torch.arange(len(rows), device=rows.device)).nonzero().squeeze(-1)
        if len(moved):
            sources = rows.index_select(0, moved)
            self._k.index_copy_(0, moved, self._k.index_select(0, sources))
            self._v.index_copy_(0, moved, self._v.index_select(0, sources))
        self._k, self._v = self._k[:len(rows), :, start:], self._v[:len(rows), :, start:]
        self.length -= start


def compacting_order(alive: list[bool]) -> list[int]:
    """The rows to ``keep`` when only the ``alive`` ones go on: each finished row's slot is
    taken by a live row from past the new end, so the fewest rows move (order is not kept)."""
    count = sum(alive)
    tail = [i for i in range(count, len(alive)) if alive[i]]
    holes = iter(tail)
    return [i if alive[i] else next(holes) for i in range(count)]


def slack_cache() -> Cache:
    """An empty cache of ``SlackLayer``s, one per model layer, created by the first forward."""
    return Cache(layer_class_to_replicate=SlackLayer)


def concat_rows(first: Cache, second: Cache, width: int) -> Cache:
    """Rows of ``first`` then rows of ``second``, each left-padded to ``width`` columns, in one
    new buffer per layer that keeps ``SLACK`` spare columns. The padding is zeros, not empty
    memory: a masked column still meets its value in attention, and 0 x NaN would be NaN."""
    cache = Cache(layers=[SlackLayer() for _ in first.layers])
    for merged, a, b in zip(cache.layers, first.layers, second.layers):
        rows = a.keys.shape[0] + b.keys.shape[0]
        shape = (rows, a.keys.shape[1], width + SLACK, a.keys.shape[3])
        keys, values = a.keys.new_empty(shape), a.values.new_empty(shape)
        at = 0
        for part in (a, b):
            n, pad = part.keys.shape[0], width - part.length
            for buffer, tensor in ((keys, part.keys), (values, part.values)):
                buffer[at:at + n, :, :pad] = 0
                buffer[at:at + n, :, pad:width] = tensor
            at += n
        merged.is_initialized, merged.device = True, keys.device
        merged.keys, merged.values = keys, values
        merged.length = width
    return cache


def prefix_rows(rows: "list[list[Segment]]", width: int, room: int) -> Cache:
    """A cache holding, per row, the keys/values of ``rows[i]``'s parts end to end,
    right-aligned in ``width`` columns (zeros before them; a row with no parts is all zeros),
    copied into one new buffer per layer with room for ``room`` more columns plus ``SLACK``:
    the past of a prefill that continues cached prefixes (``KVBatch._prefill_distinct``)."""
    ref = next(row[0] for row in rows if row)
    cache = Cache(layers=[SlackLayer() for _ in ref.keys])
    for i, layer in enumerate(cache.layers):
        buffers = []
        for tensors in (ref.keys, ref.values):
            heads, _, dim = tensors[i].shape
            buffers.append(tensors[i].new_zeros(len(rows), heads, width + room + SLACK, dim))
        for r, parts in enumerate(rows):
            at = width - sum(part.length for part in parts)
            for part in parts:
                buffers[0][r, :, at:at + part.length] = part.keys[i]
                buffers[1][r, :, at:at + part.length] = part.values[i]
                at += part.length
        layer.is_initialized, layer.device = True, buffers[0].device
        layer.keys, layer.values = buffers
        layer.length = width
    return cache
