"""Cutting a batch into micro-batches that compute no padding they can avoid.

A step's batch is right-padded to its longest sequence. Run as it is, a short row pays for
the longest one's positions in every layer. Two things remove most of that cost without
changing any result:

- **cropping**: a micro-batch is cut to its own longest row (the columns past it are padding
  in every row), and its per-token outputs are padded back into the batch layout;
- **length-sorted packing by a token budget** (``train.max_tokens_per_micro_batch``): rows are
  sorted by length and a micro-batch takes rows while ``rows x longest row`` stays within the
  budget, so rows of alike length share a forward, and short rows go many to a micro-batch.

Without a budget, micro-batches are ``train.micro_batch_size`` consecutive rows (cropped). The
loss closures normalise by the global token and sequence counts, so neither the order nor the
split of the rows changes the loss or the gradient beyond float summation order.

- **a shared prompt computed once** (``train.share_prompt``): the samples of a group share their
  prompt, so micro-batches are planned group by group and each runs the prompt through the
  decoder once, then the responses of every row on top of its cache (``shared_prefix_length``;
  ``engines.logprobs.body_hidden``), packed into one sequence with no padding
  where that costs fewer FLOPs (``packing_pays``). Gradients reach the prompt's positions
  through the cache, summed over the rows, as they would be row by row. Rows whose prompt no
  other row holds (an SFT batch) are planned together instead; such a micro-batch computes
  once only the opening its rows hold alike (a chat template's system turn).

Otherwise sorted buckets rather than one packed varlen sequence: on CPU the attention
kernels of transformers take a dense mask, so a packed row computes attention over the full
``length²`` (block-diagonal, most of it masked), which for long rows costs more than the
padding it saves; a group's short replies on its shared prompt are where packing pays.
"""

from __future__ import annotations

import torch

from loongsage.engines.batch import TrainBatch


def row_lengths(batch: TrainBatch) -> torch.Tensor:
    """[N] tokens up to and including each row's last real one (right padding)."""
    mask = batch.attention_mask.bool()
    positions = torch.arange(1, mask.shape[1] + 1).expand_as(mask)
    return (positions * mask).amax(-1)


def prompt_keys(batch: TrainBatch) -> list[tuple[int, ...]]:
    """Per row, its tokens before the first loss-mask position (its prompt): rows with equal
    keys share that prefix (the samples of a group); a row without loss tokens is its own."""
    first = batch.loss_mask.gt(0).float().argmax(-1).tolist()
    has_loss = batch.loss_mask.gt(0).any(-1).tolist()
    return [tuple(batch.input_ids[row, :first[row]].tolist()) if has_loss[row] else (-1 - row,)
            for row in range(len(batch))]


def plan_micro_batches(lengths: torch.Tensor, rows_per_micro_batch: int, token_budget: int,
                       keys: list | None = None) -> list[torch.Tensor]:
    """Row indices of each micro-batch: consecutive ``rows_per_micro_batch`` rows, or (with a
    ``token_budget`` > 0) rows sorted longest first, packed while ``rows x longest <= budget``
    (a row longer than the budget goes alone). With ``keys`` (``prompt_keys``), rows of one key
    are planned together and never share a micro-batch with another key's; rows whose key no
    other row has (an SFT batch's, each with its own prompt) are planned together as one pool,
    else each would run as a micro-batch of one row."""
    if keys is not None:
        by_key: dict = {}
        for row, key in enumerate(keys):
            by_key.setdefault(key, []).append(row)
        groups = [rows for rows in by_key.values() if len(rows) > 1]
        alone = [rows[0] for rows in by_key.values() if len(rows) == 1]
        plans = []
        for rows in groups + ([alone] if alone else []):
            index = torch.tensor(rows)
            plans.extend(index[plan] for plan in plan_micro_batches(lengths[index], rows_per_micro_batch, token_budget))
        return plans
    n = len(lengths)
    if token_budget <= 0:
        return [torch.arange(i, min(i + rows_per_micro_batch, n)) for i in range(0, n, rows_per_micro_batch)]
    order = torch.argsort(lengths, descending=True, stable=True)
    plans, current, longest = [], [], 0
    for row in order.tolist():
        length = int(lengths[row])
        if current and max(longest, length) * (len(current) + 1) > token_budget:
            plans.append(torch.tensor(current))
            current, longest = [], 0
        current.append(row)
        longest = max(longest, length)
    if current:
        plans.append(torch.tensor(current))
    return plans


def cropped(batch: TrainBatch, length: int) -> TrainBatch:
    """``batch`` cut to its first ``length`` columns (per-token extras too; per-row ones kept)."""
    full = batch.input_ids.shape[1]
    extras = {key: value[:, :length] if value.dim() >= 2 and value.shape[1] == full else value
              for key, value in batch.extras.items()}
    return TrainBatch(batch.input_ids[:, :length], batch.attention_mask[:, :length],
                      batch.loss_mask[:, :length], extras)


def shared_prefix_length(batch: TrainBatch) -> int:
    """Positions every row of ``batch`` holds alike before its first loss token (0 for one row):
    the prompt a micro-batch of one group's samples can compute once."""
    if len(batch) < 2 or not batch.loss_mask.gt(0).any():
        return 0
    ids, attn = batch.input_ids, batch.attention_mask.bool()
    alike = (ids == ids[:1]).all(0) & attn.all(0)
    first_loss = int(batch.loss_mask.gt(0).float().argmax(-1).min())
    prefix = int(alike.long().cumprod(0).sum())
    return min(prefix, first_loss)


def split_to(plans: list[torch.Tensor], count: int) -> list[torch.Tensor]:
    """``plans`` split until there are ``count`` of them (the one with most rows is halved),
    so that data-parallel ranks, which must run the same number of backwards, agree."""
    plans = list(plans)
    while len(plans) < count:
        widest = max(range(len(plans)), key=lambda i: len(plans[i]))
        if len(plans[widest]) < 2:
            raise ValueError(f"cannot cut {sum(map(len, plans))} rows into {count} micro-batches")
        plans[widest:widest + 1] = list(torch.tensor_split(plans[widest], 2))
    return plans


def micro_batches(batch: TrainBatch, plans: list[torch.Tensor]) -> list[tuple[torch.Tensor, TrainBatch]]:
    """``(rows, micro-batch)`` for each plan of rows, each micro-batch cropped to its longest row."""
    lengths = row_lengths(batch)
    return [(rows, cropped(batch.rows(rows), max(int(lengths[rows].max()), 1))) for rows in plans]


def scatter_rows(parts: list[tuple[torch.Tensor, torch.Tensor]], n: int, length: int) -> torch.Tensor:
    """``[n, length, ...]`` from ``(rows, values [len(rows), l <= length, ...])`` pairs, zeros
    in the cropped-away columns."""
    first = parts[0][1]
    out = first.new_zeros((n, length, *first.shape[2:]))
    for rows, values in parts:
        out[rows, : values.shape[1]] = values
    return out
