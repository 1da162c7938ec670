"""Where a GRPO train phase goes, and what the engine's shortcuts save, side by side.

One batch shaped like the main job's (``--groups`` prompts x ``--samples`` samples, a shared
prompt of ``--prompt-tokens`` and responses of uneven length up to ``--max-response``), one
GRPO train phase (``TrainStep``: π_old, advantages, one optimizer step) per variant,
the variants interleaved round by round on fresh copies of the same weights:

* ``before``: what the engine did before: a separate no-grad π_old forward, micro-batches of
  ``--micro-batch`` consecutive rows padded to the batch's longest row, the fp32 LM head over
  every real position (the prompt included). Rebuilt here by a subclass that restores those
  two engine methods, so both sides run in one process.
* ``pi_old fused``: π_old taken detached from the loss forward (one optimizer step).
* ``+ cropped, head on response``: also micro-batches cut to their longest row and the LM head
  over loss-mask positions only (the engine's default now).
* ``+ shared prompt, replies padded``: also each group's prompt computed once per micro-batch,
  its KV cache repeated over the group's rows and the replies run padded to the longest
  (``train.share_prompt`` as it was first built; the engine's padded path, chosen here by
  swapping its ``packing_pays`` rule for one that never packs).
* ``+ shared prompt``: the same with the replies packed into one sequence on the prompt's
  cache where that costs fewer FLOPs, so no padding runs through the layers (the engine's
  default now).
* ``+ token budget``: all of the above with length-sorted micro-batches packed by
  ``train.max_tokens_per_micro_batch`` (``--token-budget``) within each group.

Every variant must give the same loss and weights (checked: the table prints the largest weight
difference against ``before``). Seconds are wall time of the whole phase, medians over rounds.

    .venv/bin/python benchmarks/train_step.py [--model tiny|smollm2] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from typing import Any, Iterator

import torch

from loongsage.algorithms.objective import Objective
from loongsage.controller.train_step import TrainStep
from loongsage.engines.batch import TrainBatch
from loongsage.engines.distributed import RankShards
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.engines import logprobs as engine_logprobs
from loongsage.engines.logprobs import TokenScores
from loongsage.models.resolve import resolve_model_path
from loongsage.plugins import get_registries
from loongsage.schema import ModelConfig, TrainConfig


class BeforeEngine(EmbeddedTrainEngine):
    """The engine's previous micro-batching and LM head: padded rows, every position scored."""

    def _micro_batches(self, batch: TrainBatch) -> list[tuple[torch.Tensor, TrainBatch]]:
        size, n = self.train_cfg.micro_batch_size, len(batch)
        return [(rows, batch.rows(rows)) for rows in (torch.arange(i, min(i + size, n)) for i in range(0, n, size))]

    def _scores(self, model: Any, batch: TrainBatch, with_entropy: bool, logit_term: Any,
                entropy_grad: bool = True) -> TokenScores:
        return self.parallel.token_scores(model, batch.input_ids, batch.attention_mask,
                                          fp32_lm_head=self.model_cfg.fp32_lm_head, with_entropy=with_entropy,
                                          entropy_grad=entropy_grad, chunk_tokens=self.train_cfg.logprob_chunk_tokens)


PACKING_PAYS = engine_logprobs.packing_pays


def never_pack(*_: Any) -> bool:
    return False


@contextlib.contextmanager
def packing(rule: Any) -> Iterator[None]:
    """The engine's choice between packed and padded replies made by ``rule`` inside the block."""
    engine_logprobs.packing_pays = rule
    try:
        yield
    finally:
        engine_logprobs.packing_pays = PACKING_PAYS


class RecomputedObjective(Objective):
    """GRPO that always asks for the separate π_old forward."""

    def old_from_loss_forward(self, mini_batches: int) -> bool:
        return False


def main_job_batch(groups: int, samples: int, prompt: int, max_response: int, vocab: int) -> tuple:
    g = torch.Generator().manual_seed(0)
    n = groups * samples
    lengths = torch.randint(max_response // 4, max_response + 1, (n,), generator=g)
    width = prompt + int(lengths.max())
    ids = torch.randint(3, vocab, (n, width), generator=g)
    attn, mask = torch.zeros(n, width, dtype=torch.long), torch.zeros(n, width)
    for row in range(n):
        ids[row, :prompt] = ids[(row // samples) * samples, :prompt]  # a group shares its prompt
        end = prompt + int(lengths[row])
        attn[row, :end], mask[row, prompt:end] = 1, 1.0
    roll = -torch.rand(n, width, generator=g) * mask
    rewards = (torch.rand(n, generator=g) > 0.5).float()
    groups_index = torch.arange(n) // samples
    return TrainBatch(ids, attn, mask, {"rollout_logprobs": roll}), rewards, groups_index


VARIANTS = {  # name: (engine, objective, token budget (None: --token-budget), share_prompt, packing rule)
    "before": (BeforeEngine, RecomputedObjective, 0, False, PACKING_PAYS),
    "pi_old fused": (BeforeEngine, Objective, 0, False, PACKING_PAYS),
    "+ cropped, head on response": (EmbeddedTrainEngine, Objective, 0, False, PACKING_PAYS),
    "+ shared prompt, replies padded": (EmbeddedTrainEngine, Objective, 0, True, never_pack),
    "+ shared prompt": (EmbeddedTrainEngine, Objective, 0, True, PACKING_PAYS),
    "+ token budget": (EmbeddedTrainEngine, Objective, None, True, PACKING_PAYS),
}


def run(args: argparse.Namespace) -> dict:
    path = str(resolve_model_path(f"builtin:{args.model}"))
    torch.set_num_threads(args.threads)
    spec = Objective.from_config({"policy_loss": {"name": "ppo_clip"}, "kl": {"method": "k3", "coef": 0.0}},
                                 get_registries()).spec
    probe = EmbeddedTrainEngine(ModelConfig(path=path), TrainConfig(), device="cpu")
    vocab = probe.model.config.vocab_size
    initial = {k: v.clone() for k, v in probe.model.state_dict().items()}
    del probe
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    drift: dict[str, float] = {}
    for _ in range(args.rounds):
        reference = None
        for name, (engine_cls, objective_cls, budget, share, packing_rule) in VARIANTS.items():
            train = TrainConfig(lr=1e-5, micro_batch_size=args.micro_batch, num_threads=args.threads, share_prompt=share,
                                max_tokens_per_micro_batch=args.token_budget if budget is None else budget)
            engine = engine_cls(ModelConfig(path=path), train, device="cpu")
            engine.model.load_state_dict(initial)
            batch, rewards, groups = main_job_batch(args.groups, args.samples, args.prompt_tokens,
                                                    args.max_response, vocab)
            shards = RankShards([torch.arange(len(batch))], [torch.zeros(len(batch), dtype=torch.bool)], 1)
            start = time.perf_counter()
            with packing(packing_rule):
                TrainStep(objective_cls(spec))(engine, (batch, rewards, groups), shards)
            seconds[name].append(time.perf_counter() - start)
            state = engine.model.state_dict()
            if reference is None:
                reference = {k: v.clone() for k, v in state.items()}
            drift[name] = max(drift.get(name, 0.0),
                              max(float((state[k] - reference[k]).abs().max()) for k in state))
            del engine
    base = statistics.median(seconds["before"])
    rows = [{"variant": name, "seconds": statistics.median(s), "range": [min(s), max(s)],
             "speedup_vs_before": base / statistics.median(s), "max_weight_diff": drift[name]}
            for name, s in seconds.items()]
    batch, _, _ = main_job_batch(args.groups, args.samples, args.prompt_tokens, args.max_response, vocab)
    real = int(batch.attention_mask.sum())
    return {"model": args.model, "rows": len(batch), "padded_tokens": batch.input_ids.numel(), "real_tokens": real,
            "response_tokens": int(batch.loss_mask.sum()), "threads": args.threads, "rounds": args.rounds,
            "variants": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", choices=["tiny", "smollm2"])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=60)
    parser.add_argument("--max-response", type=int, default=48)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--token-budget", type=int, default=640)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.model}: {result['rows']} rows, {result['padded_tokens']} padded / {result['real_tokens']} real / "
          f"{result['response_tokens']} response tokens, {args.threads} threads, {args.rounds} rounds")
    print(f"{'variant':30} {'s (median)':>11} {'range':>15} {'speedup':>8} {'max |dW|':>10}")
    for row in result["variants"]:
        low, high = row["range"]
        print(f"{row['variant']:30} {row['seconds']:11.3f} {low:7.3f}-{high:<7.3f} "
              f"{row['speedup_vs_before']:7.2f}x {row['max_weight_diff']:10.2e}")


if __name__ == "__main__":
    main()
