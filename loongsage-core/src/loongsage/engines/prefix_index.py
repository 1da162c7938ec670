"""Which token prefixes a replica has been sent: the pool's guess at each engine's prefix cache.

The pool cannot see inside an engine's cache (the embedded engine's radix tree, SGLang's radix
cache), so, like SGLang's router in its cache-aware policy (``sgl-router``'s approximate tree
per worker), it remembers what it sent each replica and routes a new session to the replica
holding the longest prefix of its prompt. The record is approximate by design: it does not see
an engine's eviction or a flush at a weight update (a wrong guess costs a prefill, never a
wrong token).

Prompts are cut into blocks of ``BLOCK`` tokens; each block's key is a hash chained from the
blocks before it (vLLM's automatic prefix caching keys its KV blocks the same way), so a
lookup is one dictionary probe per block and two prompts share a key only when they share
every token up to it. At most ``capacity`` keys are kept, the least recently used dropped.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterator, Sequence

BLOCK = 16  # tokens per key


def _keys(tokens: Sequence[int]) -> Iterator[int]:
    key = 0
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        key = hash((key, tuple(tokens[start:start + BLOCK])))
        yield key


class PrefixIndex:
    """Prefixes sent to one replica, in whole blocks, LRU-bounded."""

    def __init__(self, capacity: int = 1 << 16) -> None:
        self.capacity = capacity
        self._keys: OrderedDict[int, None] = OrderedDict()

    def match(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of ``tokens`` (whole blocks) were sent here."""
        n = 0
        for key in _keys(tokens):
            if key not in self._keys:
                break
            self._keys.move_to_end(key)
            n += BLOCK
        return n

    def record(self, tokens: Sequence[int]) -> None:
        """Remember ``tokens`` (their whole blocks) as sent here."""
        for key in _keys(tokens):
            self._keys[key] = None
            self._keys.move_to_end(key)
        while len(self._keys) > self.capacity:
            self._keys.popitem(last=False)

    def clear(self) -> None:
        self._keys.clear()
