"""Supervised warm start: teach a model a task's answer format (or tool use) before RL.

Cross-entropy on the model's own turns only (each assistant turn plus the end-of-turn token
that stops it), run through the train engine's ``train_step`` with a token-mean closure, so
SFT and RL share one optimizer loop, one checkpoint format and one weight sync path.

A ``Demonstration`` is a prompt, the turns that follow it (assistant turns, and for a
multi-turn tool task the tool results between them) and the tools the agent offers. It is
tokenised exactly the way the AgentFlow router builds a rollout (``agentflow.tito``): the
prompt and every tool result are rendered with the chat template as the text new since the
last turn, each assistant turn is tokenised on its own and closed with the stop token, and
the template's text after a stop token is prompt, not target. So a warm-started model sees
at training time the very token split it will produce at rollout time. Tool calls are
written the way the chat template writes them, or, for templates without tool support
(SmolLM2's), by the source's tool parser, so the router reads them back at rollout.

A prompt without a ``metadata["demonstration"]`` becomes one assistant turn: its
``metadata["solution"]`` when the dataset provides a worked one, else
``\\boxed{ground_truth}``.

SFT gets a fresh AdamW at its own learning rate, optionally warmed up linearly over
``warmup_steps`` and then decayed (``algorithms.lr_schedule``: constant, linear or cosine to
zero over the remaining steps); the engine's optimizer is reset to ``train.lr`` afterwards, so
RL does not inherit SFT's moment estimates. While it runs, each
step's loss is kept in ``SFT_PROGRESS`` (the train actor runs calls concurrently, so the
controller reads it with ``sft_progress`` and shows the warm start's progress).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from loongsage.algorithms.lr_schedule import learning_rate
from loongsage.engines.batch import LossContext, TrainBatch
from loongsage.errors import LoongSageError


@dataclass
class Demonstration:
    """A prompt and the turns that should follow it; its assistant turns are the targets.

    ``parser`` (the run's tool parser, ``agentflow.tool_parser``) writes tool calls the chat
    template leaves out; only demonstrations with tool calls need one.
    """

    messages: list[dict[str, Any]]
    completion: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    parser: Any = None
    origin: str = "demonstration"  # where the target came from: demonstration | solution | ground truth
    source: str = ""  # the data source of its prompt


ORIGINS = {  # what the start-up line says each kind of target is
    "demonstration": "the source's demonstrations",
    "solution": "the source's worked solutions",
    "ground truth": "\\boxed{ground truth} of each prompt, the answers the reward checks",
}


def describe_warm_start(examples: Sequence[Demonstration], steps: int) -> str:
    """One line saying what the warm start trains on, per data source (said at its start: on
    one's own prompts it trains on their ground truth, which lifts the reward before RL)."""
    counts: dict[tuple[str, str], int] = {}
    for demo in examples:
        counts[demo.source, demo.origin] = counts.get((demo.source, demo.origin), 0) + 1
    parts = [f"{n} from {source or 'the data'} ({ORIGINS[origin]})" for (source, origin), n in counts.items()]
    return (f"sft warm start: {steps} steps on {len(examples)} examples: {'; '.join(parts)}; "
            "trainer.sft.steps=0 skips it")


def demonstration_of(prompt: Any, tools: list[dict[str, Any]], parser: Any = None) -> Demonstration:
    """The demonstration a dataset's prompt carries, or its answer as one assistant turn."""
    completion, origin = prompt.metadata.get("demonstration"), "demonstration"
    if not completion:
        solution = prompt.metadata.get("solution")
        origin = "solution" if solution else "ground truth"
        completion = [{"role": "assistant", "content": solution or f"\\boxed{{{prompt.ground_truth}}}"}]
    return Demonstration(list(prompt.messages), [dict(m) for m in completion], list(tools), parser, origin,
                         getattr(prompt, "source", ""))


def sft_examples(sources: Mapping[str, Any], n: int, seed: int = 0, parser: Any = None) -> list[Demonstration]:
    """``n`` demonstrations drawn round-robin from data sources' prompts.

    Indices are drawn with a seeded RNG from each source's range (the first ``n`` indices
    for unbounded sources); each source's agent names the tools its prompts are shown with,
    and ``parser`` (the run's tool parser) writes their tool calls.
    """
    if not sources:
        raise LoongSageError("sft: no data sources to draw examples from")
    rng = random.Random(f"sft:{seed}")
    names = list(sources)
    tools = {name: source.tool_schemas() for name, source in sources.items()}
    out: list[Demonstration] = []
    for i in range(n):
        name = names[i % len(names)]
        size = sources[name].size()
        prompt = sources[name].get(rng.randrange(size) if size else i // len(names))
        out.append(demonstration_of(prompt, tools[name], parser))
    return out


def encode_demonstration(tokenizer: Any, demo: Demonstration) -> tuple[list[int], list[int]]:
    """Token ids of the whole conversation and a loss mask that is 1 on the model's turns."""
    from loongsage.agentflow.messages import ChatRequest
    from loongsage.agentflow.store import Trajectory
    from loongsage.agentflow.tito import ChatRenderer, plan_turn, record_generation

    renderer = ChatRenderer(tokenizer)
    traj = Trajectory("sft", "0")
    history = [dict(m) for m in demo.messages]
    for message in demo.completion:
        if message.get("role") == "assistant":
            plan = plan_turn(traj, ChatRequest("openai_chat", "sft", list(history), demo.tools),
                             renderer)
            text = renderer.assistant_text(history, message, demo.tools, demo.parser)
            ids = renderer.encode(text) + [tokenizer.eos_token_id]
            record_generation(traj, plan.segment, ids, [0.0] * len(ids), [0] * len(ids), "stop",
                              message, renderer.eos_text)
        history.append(dict(message))
    samples = traj.to_samples()
    if len(samples) != 1:
        raise LoongSageError(f"sft: a demonstration needs at least one assistant turn and one "
                             f"conversation, got completion {demo.completion!r}")
    sample = samples[0]
    return (sample.prompt_ids + sample.response_ids,
            [0] * len(sample.prompt_ids) + list(sample.loss_mask))


def sft_batch(tokenizer: Any, examples: Sequence[Demonstration]) -> TrainBatch:
    """Right-padded batch whose loss mask covers the model's turns (and their stop tokens)."""
    encoded = [encode_demonstration(tokenizer, demo) for demo in examples]
    length = max(len(ids) for ids, _ in encoded)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    input_ids = torch.full((len(encoded), length), pad, dtype=torch.long)
    attention = torch.zeros((len(encoded), length), dtype=torch.long)
    loss_mask = torch.zeros((len(encoded), length), dtype=torch.float32)
    for row, (ids, mask) in enumerate(encoded):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
        loss_mask[row, : len(ids)] = torch.tensor(mask, dtype=torch.float32)
    return TrainBatch(input_ids, attention, loss_mask)


SFT_PROGRESS: dict[str, Any] = {"step": 0, "steps": 0, "loss": float("nan")}


def sft_progress(_engine: Any = None) -> dict[str, Any]:
    """Steps done, steps asked for and the last loss of the warm start running in this process."""
    return dict(SFT_PROGRESS)


def token_mean_nll(ctx: LossContext) -> torch.Tensor:
    """Cross-entropy averaged over every answer token of the mini-batch."""
    return -(ctx.logprobs * ctx.batch.loss_mask).sum() / ctx.global_num_tokens


def run_sft(
    engine: Any,
    examples: Sequence[Demonstration],
    tokenizer: Any,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int = 0,
    warmup_steps: int = 0,
    decay: str = "constant",
) -> list[float]:
    """``steps`` optimizer steps on random batches of ``examples``, the learning rate following
    ``learning_rate`` (warm-up, then ``decay``); return each step's loss."""
    if not examples:
        raise LoongSageError("trainer.sft: no examples to train on")
    if batch_size < 1 or steps < 0:
        raise LoongSageError(
            f"trainer.sft: need batch_size >= 1 and steps >= 0, got {batch_size} and {steps}"
        )
    rng = random.Random(f"sft-batches:{seed}")
    engine.reset_optimizer(lr)
    losses: list[float] = []
    SFT_PROGRESS.update(step=0, steps=steps, loss=float("nan"))
    try:
        for step in range(steps):
            chosen = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
            batch = engine.parallel.local_rows(sft_batch(tokenizer, chosen))  # this rank's share
            for group in engine.optimizer.param_groups:
                group["lr"] = learning_rate(step, steps, lr, warmup_steps, decay)
            metrics = engine.train_step(batch, token_mean_nll)
            losses.append(metrics["train/loss"])
            SFT_PROGRESS.update(step=step + 1, loss=losses[-1])
    finally:
        engine.reset_optimizer()
    return losses


def train_sft(engine: Any, examples: Sequence[Demonstration], sft: Any, seed: int) -> list[float]:
    """``run_sft`` with the engine's own tokenizer (shipped into the train actor), as
    ``trainer.sft`` (an ``SFTConfig``) asks, its batches drawn in the order ``seed`` (the run's
    ``trainer.seed``) gives."""
    return run_sft(engine, examples, engine.tokenizer, sft.steps, sft.batch_size, sft.lr,
                   seed=seed, warmup_steps=sft.warmup_steps, decay=sft.lr_decay)
