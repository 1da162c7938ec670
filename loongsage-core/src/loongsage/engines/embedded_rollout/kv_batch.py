"""The running decode batch: one left-padded KV cache shared by all running requests.

Why not transformers' continuous batching: on CPU its per-step overhead makes it ~5x slower
than static batching (benchmarks/embedded_engine.py, docs/benchmarks.md). This module keeps the
decode step as cheap as a plain ``generate`` step and pays for batch changes only when they happen:

* **admit**: new requests are prefilled together (left-padded, one forward; identical
  prompts, the samples of one group, once, their cache rows repeated: SGLang's radix cache
  shares such a prefix too; with a ``prefix_cache``, from each prompt's longest cached prefix,
  feeding only the tokens past it), and their cache is merged into the running one by left-padding the narrower cache to the common
  width and concatenating along the batch dimension;
* **evict**: finished or aborted rows are dropped in place: each one's slot is taken by a
  live row from the end (``compacting_order``; row order is not kept), then leading columns
  that are padding in every remaining row are sliced off (a view), so a long finished
  request does not leave its width behind;
* **decode**: one token per row, ``position_ids`` = the row's count of real tokens, the 2-D
  attention mask marks the padding, exactly as ``generate`` does for a left-padded batch; the
  new key/value column is written in place into the cache's spare columns (``slack_cache``),
  where ``generate``'s cache copies itself at every token.

Padded key/value slots are zeroed after prefill so no value computed for a padding position
can reach a real row. Logits are computed for the last position only, in fp32 (either
because the model is fp32, or via an fp32 copy of the LM head when ``fp32_lm_head`` is set).
"""

from __future__ import annotations

from typing import Callable

import torch
from transformers.cache_utils import Cache

from loongsage.engines.embedded_rollout.prefix_cache import Match, PrefixCache, Segment
from loongsage.engines.embedded_rollout.slack_cache import concat_rows, prefix_rows, slack_cache


class LogitsHead:
    """Runs the model and returns fp32 logits of the last position of each row."""

    def __init__(self, model: torch.nn.Module, fp32_lm_head: bool):
        self.model = model
        self.split = fp32_lm_head and next(model.parameters()).dtype != torch.float32
        self._w32: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def refresh(self) -> None:
        """Drop the cached fp32 LM-head weight (call after the weights change or move)."""
        self._w32 = None

    def __call__(self, input_ids, attention_mask, position_ids, cache) -> torch.Tensor:
        if not self.split:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             position_ids=position_ids, use_cache=True, logits_to_keep=1, cache=cache)
            return out.logits[:, -1].float()
        decoder = self.model.get_decoder()
        out = decoder(input_ids=input_ids, attention_mask=attention_mask,
                      position_ids=position_ids, use_cache=True, cache=cache)
        if self._w32 is None:
            head = self.model.get_output_embeddings()
            bias = None if head.bias is None else head.bias.float()
            self._w32 = (head.weight.float(), bias)
        return torch.nn.functional.linear(out.last_hidden_state[:, -1].float(), *self._w32)


class KVBatch:
    """KV cache + attention mask of the running rows; row order matches ``rows``."""

    def __init__(self, cache: Cache, mask: torch.Tensor):
        self.cache = cache
        self.mask = mask  # [B, W] long, 1 = real token
        self.lengths = mask.sum(dim=-1)  # [B] real tokens per row
        self.shared_tokens = 0  # prompt tokens a prefill did not recompute (identical prompts)
        self.cached_tokens = 0  # prompt tokens a prefill took from the prefix cache
        self.prefill_rows: torch.Tensor | None = None  # row -> the distinct prompt's forward row, when shared
        self.fed = mask.shape[1]  # columns a prefill's forward fed (the rest came from the prefix cache)
        self.reused: list[int] = [0] * mask.shape[0]  # per row: prompt tokens a prefill did not compute
        self.reused_routes: list[torch.Tensor | None] = [None] * mask.shape[0]  # their MoE routes

    @property
    def size(self) -> int:
        return self.mask.shape[0]

    @classmethod
    def prefill(cls, head: LogitsHead, prompts: list[list[int]], device: torch.device | str = "cpu",
                cache: PrefixCache | None = None) -> tuple["KVBatch", torch.Tensor]:
        """Prefill ``prompts`` in one left-padded forward on ``device`` (the model's); returns
        the batch and fp32 logits. Identical prompts (the G samples of a group) are computed
        once and their cache rows repeated; ``shared_tokens`` counts the tokens not recomputed.
        With a prefix ``cache``, each distinct prompt starts from its longest cached prefix
        (``_prefill_distinct``); ``reused`` counts, per row, the prompt tokens not computed."""
        distinct: dict[tuple[int, ...], int] = {}
        rows = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        seqs = [list(p) for p in distinct]
        hits = [cache.match(p[:-1]) for p in seqs] if cache is not None else [Match(0)] * len(seqs)
        batch, logits = cls._prefill_distinct(head, seqs, device, hits)
        batch.shared_tokens = sum(map(len, prompts)) - sum(map(len, distinct))
        if len(distinct) == len(prompts):
            return batch, logits
        first = {row: i for i, row in reversed(list(enumerate(rows)))}
        index = torch.tensor(rows, dtype=torch.long, device=batch.mask.device)
        batch.cache.batch_select_indices(index)
        repeated = cls(batch.cache, batch.mask.index_select(0, index))
        repeated.shared_tokens, repeated.prefill_rows, repeated.fed = batch.shared_tokens, index, batch.fed
        repeated.cached_tokens = batch.cached_tokens
        repeated.reused = [batch.reused[row] if first[row] == i else len(prompts[i])
                           for i, row in enumerate(rows)]
        repeated.reused_routes = [batch.reused_routes[row] for row in rows]
        return repeated, logits.index_select(0, index)

    @classmethod
    def _prefill_distinct(cls, head: LogitsHead, prompts: list[list[int]],
                          device: torch.device | str, hits: list[Match]) -> tuple["KVBatch", torch.Tensor]:
        """One forward over the tokens past each prompt's cached prefix (``hits``).

        Rows stay right-aligned with no padding inside a row (what the decode step, the
        eviction and a sliding-window mask rely on): the forward feeds ``fed`` columns, the
        longest uncached suffix; a row with a shorter suffix feeds its last ``fed`` tokens, so
        part of its cached prefix is computed again, and a row shorter than ``fed`` is fed
        whole. The cached part of each row is copied into the batch's own buffer
        (``prefix_rows``), so the forward writes nothing the prefix cache holds."""
        fed = max(len(p) - h.length for p, h in zip(prompts, hits))
        reused = [max(len(p) - fed, 0) for p in prompts]
        past = max(reused)
        width = past + fed
        ids = torch.zeros(len(prompts), fed, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for i, p in enumerate(prompts):
            tail = p[reused[i]:]
            ids[i, fed - len(tail):] = torch.tensor(tail, dtype=torch.long)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)[:, past:]
        parts = [h.head(n) for h, n in zip(hits, reused)]
        cache = prefix_rows(parts, past, fed) if past else slack_cache()
        logits = head(ids, mask, positions, cache)
        if not bool(mask.all()):
            pad = (mask == 0)[:, None, :, None]
            for layer in cache.layers:
                layer.keys.masked_fill_(pad, 0)
                layer.values.masked_fill_(pad, 0)
        batch = cls(cache, mask)
        batch.fed, batch.reused, batch.cached_tokens = fed, reused, sum(reused)
        batch.reused_routes = [torch.cat([p.routes for p in row]) if row and row[0].routes is not None
                               else None for row in parts]
        return batch, logits

    def row_segment(self, row: int) -> Callable[[int, int], Segment]:
        """``take(start, end)``: keys and values of row ``row``'s real tokens ``start:end``
        (views): what the prefix cache copies out of the batch (``PrefixCache.insert``)."""
        offset = self.mask.shape[1] - int(self.lengths[row])

        def take(start: int, end: int) -> Segment:
            cols = slice(offset + start, offset + end)
            return Segment([layer.keys[row, :, cols] for layer in self.cache.layers],
                           [layer.values[row, :, cols] for layer in self.cache.layers])

        return take

    def decode(self, head: LogitsHead, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row; returns fp32 logits [B, V]."""
        positions = self.lengths.unsqueeze(-1)
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.size, 1)], dim=-1)
        self.lengths = self.lengths + 1
        return head(tokens.unsqueeze(-1), self.mask, positions, self.cache)

    def merge(self, other: "KVBatch") -> "KVBatch":
        """Rows of ``self`` followed by rows of ``other``, left-padded to a common width."""
        width = max(self.mask.shape[1], other.mask.shape[1])

        def pad(mask: torch.Tensor) -> torch.Tensor:
            return torch.cat([mask.new_zeros(mask.shape[0], width - mask.shape[1]), mask], dim=1)

        mask = torch.cat([pad(self.mask), pad(other.mask)])
        return KVBatch(concat_rows(self.cache, other.cache, width), mask)

    def select(self, keep: list[int]) -> "KVBatch | None":
        """Keep only rows ``keep`` (in that order) and trim all-padding leading columns."""
        if not keep:
            return None
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        start = int((mask.sum(dim=0) > 0).long().argmax())
        mask = mask[:, start:]
        for layer in self.cache.layers:
            layer.keep(index, start)
        self.mask = mask
        self.lengths = self.lengths.index_select(0, index)
        return self
