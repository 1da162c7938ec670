"""The prefix cache: keys/values of token prefixes kept across requests, under a byte budget.

A multi-turn trajectory sends, at every turn, its whole history again (system prompt, task,
every earlier call and result); a group's samples sent as separate requests share their
prompt. Kept here, the KV of those tokens is prefilled once: a request feeds only the tokens
past its longest cached prefix.

**Structure: a radix tree** (SGLang's RadixAttention, Zheng et al. 2023, arXiv 2312.07104,
``python/sglang/srt/mem_cache/radix_cache.py``), at token granularity: every edge holds a run
of tokens and, per model layer, their keys and values (``[kv_heads, tokens, head_dim]``, the
batch dimension dropped), plus on an MoE model the experts each token was routed to (so a
request served from the cache still reports routes for its whole sequence, ``engines.routing``).
A lookup walks the tree comparing tokens and may end inside an edge. Chosen over hashing
fixed-size blocks (vLLM's automatic prefix caching) because a hit then covers the whole common
prefix, not the whole blocks of it, and the tree needs no hash of every prefix.

**Never mutated by a request.** ``match`` returns views of the matched entries; the batch that
uses them copies them into a buffer of its own (``slack_cache.prefix_rows``). ``insert`` clones what it keeps out of the
running batch, and splitting an edge clones both halves. So a request that extends a cached
prefix writes only its own buffer, and a cached entry is never referenced by a running batch:
every entry can be evicted at any time.

**Budget.** ``budget_bytes`` bounds the bytes of all kept tensors. After an insert, the least
recently used *leaves* (no kept prefix extends them) are dropped until the total fits; an inner
node becomes a leaf once its children are gone, so a shared prefix outlives its extensions.

**Validity.** KV depends on the weights: the scheduler clears the cache when the weights change
unless ``rollout.prefix_cache.keep_on_update`` is set (``scheduler``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

GiB = 1 << 30


@dataclass
class Segment:
    """Keys and values (one tensor per layer, ``[kv_heads, n, head_dim]``) and, on an MoE
    model, routes (``[n, layers, top_k]``) of ``n`` consecutive tokens."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    routes: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.keys[0].shape[1]

    @property
    def nbytes(self) -> int:
        tensors = [*self.keys, *self.values] + ([self.routes] if self.routes is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)

    def cut(self, start: int, end: int) -> "Segment":
        """Tokens ``start:end`` as views (callers clone what they keep)."""
        return Segment([k[:, start:end] for k in self.keys], [v[:, start:end] for v in self.values],
                       None if self.routes is None else self.routes[start:end])

    def cloned(self) -> "Segment":
        return Segment([k.clone() for k in self.keys], [v.clone() for v in self.values],
                       None if self.routes is None else self.routes.clone())



class _Node:
    """An edge of the tree: its ``tokens``, their ``data`` (None only at the root), the nodes
    that extend it, and ``used``, the cache's clock at the last lookup or insert through it.

    The link to the parent is a weak reference, so a node's one strong reference is its
    parent's ``children``: a subtree dropped by ``clear`` or an eviction is freed at once by
    reference counting. With strong parent links a cleared tree was made of reference cycles
    whose tensors lived until Python's next full garbage collection, which a long-lived
    process with torch loaded runs rarely: a colocated tiny/grpo train actor's RSS grew by
    about one step's cached KV per step (docs/benchmarks.md)."""

    __slots__ = ("tokens", "data", "children", "used", "_parent", "__weakref__")

    def __init__(self, tokens: tuple[int, ...], data: Segment | None, parent: "_Node | None",
                 used: int = 0) -> None:
        self.tokens, self.data, self.used = tokens, data, used
        self.children: dict[int, _Node] = {}
        self.parent = parent

    @property
    def parent(self) -> "_Node | None":
        return None if self._parent is None else self._parent()

    @parent.setter
    def parent(self, node: "_Node | None") -> None:
        self._parent = None if node is None else weakref.ref(node)


@dataclass
class Match:
    """The longest cached prefix of a lookup: ``length`` tokens, as views of the entries on
    its path (``parts``, in order)."""

    length: int
    parts: list[Segment] = field(default_factory=list)

    def head(self, n: int) -> list[Segment]:
        """Views of the first ``n`` matched tokens, part by part."""
        out, left = [], n
        for part in self.parts:
            if left <= 0:
                break
            out.append(part if part.length <= left else part.cut(0, left))
            left -= part.length
        return out


def _common(a: Sequence[int], b: Sequence[int], start: int) -> int:
    """How many tokens ``a`` and ``b[start:]`` share at their start."""
    n = min(len(a), len(b) - start)
    i = 0
    while i < n and a[i] == b[start + i]:
        i += 1
    return i


class PrefixCache:
    """Token prefixes and their KV, longest-prefix lookup, LRU eviction under ``budget_bytes``."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ValueError(f"rollout.prefix_cache_gb: expected a positive budget, got {budget_bytes} bytes")
        self.budget_bytes = int(budget_bytes)
        self._root = _Node((), None, None)
        self._clock = 0
        self.nbytes = 0
        self.tokens = 0  # tokens kept
        self.stats = {"lookups": 0, "lookup_tokens": 0, "hit_tokens": 0, "inserted_tokens": 0,
                      "evicted_tokens": 0, "clears": 0}

    def _path(self, tokens: Sequence[int]) -> list[tuple[_Node, int]]:
        """The nodes a lookup of ``tokens`` passes, each with how many of its tokens match."""
        node, at, path = self._root, 0, []
        while at < len(tokens):
            child = node.children.get(tokens[at])
            if child is None:
                break
            n = _common(child.tokens, tokens, at)
            path.append((child, n))
            at += n
            if n < len(child.tokens):
                break
            node = child
        return path

    def match(self, tokens: Sequence[int]) -> Match:
        """The longest prefix of ``tokens`` in the cache (its entries count as used now)."""
        self._clock += 1
        path = self._path(tokens)
        for node, _ in path:
            node.used = self._clock
        length = sum(n for _, n in path)
        self.stats["lookups"] += 1
        self.stats["lookup_tokens"] += len(tokens)
        self.stats["hit_tokens"] += length
        return Match(length, [node.data if n == len(node.tokens) else node.data.cut(0, n) for node, n in path])

    def cached_length(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of ``tokens`` are cached (a look that changes nothing)."""
        return sum(n for _, n in self._path(tokens))

    def insert(self, tokens: Sequence[int], take: Callable[[int, int], Segment]) -> int:
        """Keep ``tokens``; ``take(start, end)`` gives the data of ``tokens[start:end]`` (views
        of the running batch; cloned here), asked only for what is not cached yet. Returns the
        number of tokens added; then evicts down to the budget."""
        self._clock += 1
        node, at = self._root, 0
        while at < len(tokens):
            node.used = self._clock
            child = node.children.get(tokens[at])
            if child is None:
                break
            n = _common(child.tokens, tokens, at)
            if n < len(child.tokens):
                child = self._split(child, n)
            at += n
            node = child
        node.used = self._clock
        added = len(tokens) - at
        if added:
            leaf = _Node(tuple(tokens[at:]), take(at, len(tokens)).cloned(), node, used=self._clock)
            node.children[leaf.tokens[0]] = leaf
            self.nbytes += leaf.data.nbytes
            self.tokens += added
            self.stats["inserted_tokens"] += added
            self._evict()
        return added

    def _split(self, node: _Node, n: int) -> _Node:
        """Cut ``node``'s edge after ``n`` tokens; returns the new upper node (cloned halves, so
        the old edge's storage is freed and the byte count stays exact)."""
        upper = _Node(node.tokens[:n], node.data.cut(0, n).cloned(), node.parent, used=node.used)
        lower = node.data.cut(n, len(node.tokens)).cloned()
        node.parent.children[node.tokens[0]] = upper
        node.tokens, node.data, node.parent = node.tokens[n:], lower, upper
        upper.children[node.tokens[0]] = node
        return upper

    def _evict(self) -> None:
        if self.nbytes <= self.budget_bytes:
            return
        leaves = sorted(self._leaves(), key=lambda x: x.used)
        while self.nbytes > self.budget_bytes and leaves:
            leaf = leaves.pop(0)
            self._drop(leaf)
            parent = leaf.parent
            if parent is not self._root and not parent.children:
                leaves.insert(next((i for i, x in enumerate(leaves) if x.used > parent.used), len(leaves)),
                              parent)

    def _drop(self, leaf: _Node) -> None:
        del leaf.parent.children[leaf.tokens[0]]
        self.nbytes -= leaf.data.nbytes
        self.tokens -= len(leaf.tokens)
        self.stats["evicted_tokens"] += len(leaf.tokens)

    def _leaves(self) -> list[_Node]:
        out, stack = [], list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                out.append(node)
        return out

    def clear(self) -> None:
        """Drop every entry (the weights changed, a flush, the device released)."""
        self._root.children.clear()
        self.nbytes = self.tokens = 0
        self.stats["clears"] += 1
