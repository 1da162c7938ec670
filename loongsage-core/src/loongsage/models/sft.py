"""Supervised warm start: teach a model a task's answer format before RL.

Cross-entropy on the assistant answer tokens only (plus the end-of-turn token, so the
model learns to stop), run through the train engine's ``train_step`` with a token-mean
closure, so SFT and RL share one optimizer loop, one checkpoint format and one weight
sync path. The prompt is rendered with the tokenizer's chat template and the answer is
tokenised on its own and appended: exactly the token split a rollout produces, where the
engine generates ids after the templated prompt. SFT gets a fresh AdamW at its own
learning rate; the engine's optimizer is reset to ``train.lr`` afterwards, so RL does not
inherit SFT's moment estimates.
"""

from __future__ import annotations

import random
from typing import Any, Mapping, Sequence

import torch

from loongsage.engines.batch import LossContext, TrainBatch
from loongsage.errors import LoongSageError

Example = tuple[list[dict[str, Any]], str]


def sft_examples(sources: Mapping[str, Any], n: int, seed: int = 0) -> list[Example]:
    """``n`` (messages, answer) pairs drawn round-robin from data sources' prompts.

    The answer is the prompt's ``metadata["solution"]`` when the dataset provides a worked
    one, else ``\\boxed{ground_truth}``. Indices are drawn with a seeded RNG from each
    source's range (the first ``n`` indices for unbounded sources).
    """
    if not sources:
        raise LoongSageError("sft: no data sources to draw examples from")
    rng = random.Random(f"sft:{seed}")
    names = list(sources)
    out: list[Example] = []
    for i in range(n):
        source = sources[names[i % len(names)]]
        size = source.size()
        prompt = source.get(rng.randrange(size) if size else i // len(names))
        answer = prompt.metadata.get("solution") or f"\\boxed{{{prompt.ground_truth}}}"
        out.append((prompt.messages, answer))
    return out


def encode_example(
    tokenizer: Any, messages: list[dict[str, Any]], answer: str
) -> tuple[list[int], int]:
    """Token ids of prompt + answer + eos, and the index where the answer starts."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt_ids + answer_ids, len(prompt_ids)


def sft_batch(tokenizer: Any, examples: Sequence[Example]) -> TrainBatch:
    """Right-padded batch whose loss mask covers each answer (and its eos) only."""
    encoded = [encode_example(tokenizer, m, a) for m, a in examples]
    length = max(len(ids) for ids, _ in encoded)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    input_ids = torch.full((len(encoded), length), pad, dtype=torch.long)
    attention = torch.zeros((len(encoded), length), dtype=torch.long)
    loss_mask = torch.zeros((len(encoded), length), dtype=torch.float32)
    for row, (ids, start) in enumerate(encoded):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
        loss_mask[row, start : len(ids)] = 1.0
    return TrainBatch(input_ids, attention, loss_mask)


def token_mean_nll(ctx: LossContext) -> torch.Tensor:
    """Cross-entropy averaged over every answer token of the mini-batch."""
    return -(ctx.logprobs * ctx.batch.loss_mask).sum() / ctx.global_num_tokens


def run_sft(
    engine: Any,
    examples: Sequence[Example],
    tokenizer: Any,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int = 0,
) -> list[float]:
    """``steps`` optimizer steps on random batches of ``examples``; return each step's loss."""
    if not examples:
        raise LoongSageError("trainer.sft: no examples to train on")
    if batch_size < 1 or steps < 0:
        raise LoongSageError(
            f"trainer.sft: need batch_size >= 1 and steps >= 0, got {batch_size} and {steps}"
        )
    rng = random.Random(f"sft-batches:{seed}")
    engine.reset_optimizer(lr)
    losses = []
    try:
        for _ in range(steps):
            chosen = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
            metrics = engine.train_step(sft_batch(tokenizer, chosen), token_mean_nll)
            losses.append(metrics["train/loss"])
    finally:
        engine.reset_optimizer()
    return losses


def train_sft(
    engine: Any, examples: Sequence[Example], steps: int, batch_size: int, lr: float
) -> list[float]:
    """``run_sft`` with the engine's own tokenizer (shipped into the train actor)."""
    return run_sft(engine, examples, engine.tokenizer, steps, batch_size, lr)
