"""Supervised warm start through the train engine: loss only on the model's turns, loss goes
down, demonstrations drawn from sources with their agents' tools."""

from __future__ import annotations

import pytest
import torch

from loongsage.schema import ModelConfig, SFTConfig, TrainConfig
from loongsage.controller.step_extension import StepExtensions
from loongsage.controller.sft import Demonstration, run_sft, sft_batch, sft_examples, train_sft
from loongsage.data.types import Prompt
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.plugins import get_registries


def examples(n=12):
    out = []
    for i in range(n):
        a, b = i % 7 + 1, (3 * i) % 5 + 2
        msgs = [{"role": "user", "content": f"What is {a} + {b}?"}]
        answer = f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}."
        out.append(Demonstration(msgs, [{"role": "assistant", "content": answer}]))
    return out


def test_loss_mask_covers_exactly_answer_and_eos(tiny_model_dir):
    engine = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)), TrainConfig(), device="cpu")
    tok = engine.tokenizer
    ex = examples(3)
    batch = sft_batch(tok, ex)
    for row, demo in enumerate(ex):
        msgs, answer = demo.messages, demo.completion[0]["content"]
        trained = batch.input_ids[row][batch.loss_mask[row] > 0].tolist()
        assert tok.decode(trained) == answer + "<|im_end|>"
        n = int(batch.attention_mask[row].sum())
        prompt = tok.decode(batch.input_ids[row, :n][batch.loss_mask[row, :n] == 0].tolist())
        assert prompt == tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert (batch.loss_mask[row, n:] == 0).all()


def test_sft_lowers_answer_loss_and_restores_optimizer(tiny_model_dir):
    train = TrainConfig(lr=1e-5, micro_batch_size=4)
    engine = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)), train, device="cpu")
    data = examples()
    before = engine.compute_logprobs(sft_batch(engine.tokenizer, data))["logprobs"]
    losses = run_sft(engine, data, engine.tokenizer, steps=15, batch_size=8, lr=3e-3)
    assert len(losses) == 15 and engine.weight_version == 15
    assert losses[0] > 5.0  # untrained: close to log(vocab) = 6.25
    assert sum(losses[-5:]) / 5 < 0.5 * losses[0]
    batch = sft_batch(engine.tokenizer, data)
    after = engine.compute_logprobs(batch)["logprobs"]
    mask = batch.loss_mask > 0
    assert -after[mask].mean() < 0.5 * -before[mask].mean()
    assert engine.optimizer.param_groups[0]["lr"] == 1e-5 and not engine.optimizer.state
    assert train_sft(engine, data, SFTConfig(steps=1, batch_size=2, lr=1e-3), 0)[0] < losses[0]  # engine's tokenizer


def test_each_step_trains_at_the_scheduled_rate_and_rl_gets_train_lr_back(tiny_model_dir):
    engine = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)), TrainConfig(lr=1e-5), device="cpu")
    seen = []
    step = engine.train_step
    engine.train_step = lambda batch, loss: seen.append(engine.optimizer.param_groups[0]["lr"]) or step(batch, loss)
    sft = SFTConfig(steps=5, batch_size=2, lr=4e-3, warmup_steps=2, lr_decay="linear")
    losses = train_sft(engine, examples(), sft, 0)
    assert len(losses) == 5
    assert seen == pytest.approx([2e-3, 4e-3, 4e-3, 4e-3 * 2 / 3, 4e-3 / 3])
    assert engine.optimizer.param_groups[0]["lr"] == 1e-5 and not engine.optimizer.state


def test_the_runs_seed_orders_the_warm_start_batches(tiny_model_dir):
    """``trainer.seed`` reaches the batch draw: the same seed trains the same batches in the
    same order, another seed other ones (it used to be seed 0 for every run)."""
    engine = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)), TrainConfig(), device="cpu")
    step = engine.train_step

    def batches(seed):
        seen = []
        engine.train_step = lambda batch, loss: seen.append(batch.input_ids.tolist()) or step(batch, loss)
        train_sft(engine, examples(), SFTConfig(steps=3, batch_size=2, lr=1e-6), seed)
        return seen

    first = batches(1)
    assert len(first) == 3 and batches(1) == first
    assert batches(2) != first


TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate.",
                                           "parameters": {"type": "object"}}}]


class _Source:
    def __init__(self, name, size):
        self.name, self._size = name, size

    def size(self):
        return self._size

    def get(self, index):
        meta = {"solution": f"sol {index}"} if self.name == "a" else {}
        messages = [{"role": "user", "content": f"{self.name}{index}"}]
        return Prompt(self.name, index, messages, str(index), meta)

    def tool_schemas(self):
        return TOOLS if self.name == "b" else []


def test_sft_examples_alternate_sources_and_use_solutions():
    sources = {"a": _Source("a", 50), "b": _Source("b", None)}
    parser = object()  # the run's tool parser, handed to every demonstration
    ex = sft_examples(sources, 6, seed=3, parser=parser)
    assert ex == sft_examples(sources, 6, seed=3, parser=parser)
    assert [d.messages[0]["content"][0] for d in ex] == ["a", "b"] * 3
    for demo in ex:
        index = demo.messages[0]["content"][1:]
        from_a = demo.messages[0]["content"][0] == "a"
        [turn] = demo.completion
        assert turn == {"role": "assistant",
                        "content": f"sol {index}" if from_a else f"\\boxed{{{index}}}"}
        assert (demo.tools, demo.parser) == ([] if from_a else TOOLS, parser)
    assert [d.messages[0]["content"] for d in ex[1::2]] == ["b0", "b1", "b2"]
    assert torch.tensor([int(d.messages[0]["content"][1:]) for d in ex[::2]]).lt(50).all()


def test_tool_demonstration_trains_both_assistant_turns_and_nothing_else(tiny_model_dir):
    from loongsage_agents.agents.tools import get_tools
    from loongsage_agents.datasets.params import SyntheticMathParams
    from loongsage_agents.datasets.synthetic_math import SyntheticMathDataset

    tok = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)), TrainConfig(),
                              device="cpu").tokenizer
    data = SyntheticMathDataset(SyntheticMathParams(max_operand=999, tool_demonstrations=0.5), seed=1)
    prompts = [data.get(i) for i in range(40)]
    with_demo = [p for p in prompts if "demonstration" in p.metadata]
    assert 10 <= len(with_demo) <= 30  # about half, by a seeded draw per problem
    plain = SyntheticMathDataset(SyntheticMathParams(max_operand=999), seed=1)
    assert [p.messages for p in prompts] == [plain.get(i).messages for i in range(40)]
    tools = [t.schema() for t in get_tools(["calculator"])]
    prompt = with_demo[0]
    answer, expr = prompt.ground_truth, prompt.metadata["expression"]
    demo = Demonstration(prompt.messages, prompt.metadata["demonstration"], tools,
                         get_registries().tool_parser.get("hermes")())
    batch = sft_batch(tok, [demo])
    n = int(batch.attention_mask[0].sum())
    ids, mask = batch.input_ids[0, :n].tolist(), batch.loss_mask[0, :n].tolist()
    trained_runs, run = [], []
    for tid, m in zip(ids, mask):
        if m:
            run.append(tid)
        elif run:
            trained_runs.append(tok.decode(run))
            run = []
    if run:
        trained_runs.append(tok.decode(run))
    call = f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expr}"}}}}\n</tool_call>'
    assert trained_runs == [call + "<|im_end|>", f"\\boxed{{{answer}}}<|im_end|>"]
    full = tok.apply_chat_template(demo.messages + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expr}}}]},
        {"role": "tool", "content": answer}, {"role": "assistant", "content": f"\\boxed{{{answer}}}"}],
        tools=tools, tokenize=False)
    assert tok.decode(ids) + "\n" == full  # the template's newline after the last stop is not trained


def test_template_without_tool_support_gets_the_parsers_tool_call_text():
    """SmolLM2's template drops tool calls: the demonstration's call is written by the run's
    tool parser instead, so the warm-started model writes what the router will parse."""
    from transformers import AutoTokenizer

    from loongsage.agentflow.tool_calls import ToolCall
    from loongsage.models.resolve import resolve_model_path
    from loongsage.controller.sft import encode_demonstration

    tok = AutoTokenizer.from_pretrained(resolve_model_path("builtin:smollm2"))
    call = {"id": "c", "type": "function",
            "function": {"name": "calculator", "arguments": '{"expression": "345 + 678"}'}}
    completion = [{"role": "assistant", "content": "", "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": "c", "content": "1023"},
                  {"role": "assistant", "content": "\\boxed{1023}"}]
    for name in ("hermes", "qwen3_xml"):
        parser = get_registries().tool_parser.get(name)()
        demo = Demonstration([{"role": "user", "content": "345 + 678?"}], completion, TOOLS, parser)
        ids, mask = encode_demonstration(tok, demo)
        runs, run = [], []
        for tid, m in zip(ids, mask):
            if m:
                run.append(tid)
            elif run:
                runs, run = runs + [run], []
        first, second = (tok.decode(r) for r in runs + [run] if r)
        expected = parser.render([ToolCall.from_args("calculator", {"expression": "345 + 678"})])
        assert first == expected + "<|im_end|>" and second == "\\boxed{1023}<|im_end|>"
        assert "<|im_start|>tool\n1023<|im_end|>" in tok.decode(ids)  # the template's tool turn


def test_the_warm_start_says_what_it_trains_on():
    """Said at its start: a source's worked solutions, or (on one's own prompts) the boxed
    ground truth the reward checks, which lifts the reward before any RL step."""
    from loongsage.controller.sft import describe_warm_start

    ex = sft_examples({"a": _Source("a", 50), "b": _Source("b", None)}, 6, seed=3)
    assert [(d.source, d.origin) for d in ex] == [("a", "solution"), ("b", "ground truth")] * 3
    assert describe_warm_start(ex, 10) == (
        "sft warm start: 10 steps on 6 examples: 3 from a (the source's worked solutions); 3 from b "
        "(\\boxed{ground truth} of each prompt, the answers the reward checks); trainer.sft.steps=0 skips it")


def test_warm_start_reports_progress_while_the_train_actor_runs(tiny_model_dir, monkeypatch, caplog, ray_cluster):
    """The warm start polls the real train actor (a Ray actor running calls concurrently) for
    ``sft_progress`` while ``train_sft`` runs, and logs each step count it sees."""
    import logging
    import types

    import ray

    from loongsage.controller import lifecycle
    from loongsage.controller.actors import spawn_engine
    from loongsage.controller.placement import Seat
    from loongsage.controller.train_group import TrainGroup
    from loongsage.controller.sft import sft_progress

    monkeypatch.setattr(lifecycle, "PROGRESS_EVERY_S", 0.2)
    actor = None
    try:
        cfg = {"model": {"path": str(tiny_model_dir)}, "train": {}}
        actor = spawn_engine(EmbeddedTrainEngine, cfg, Seat("train", 0, "", 0, num_cpus=1, num_gpus=0, threads=1))
        sft = SFTConfig(steps=30, batch_size=8, lr=3e-3, examples=len(examples()))
        run = types.SimpleNamespace(
            cfg=types.SimpleNamespace(trainer=types.SimpleNamespace(sft=sft, seed=0)),
            spec=types.SimpleNamespace(tool_parser=types.SimpleNamespace(obj=lambda: None)),
            sources={}, trainers=TrainGroup([actor]), rollout_actors=[], memory=None,
            extensions=StepExtensions())
        monkeypatch.setattr(lifecycle, "sft_examples", lambda *a, **k: examples())
        with caplog.at_level(logging.INFO, logger="loongsage"):
            lifecycle.warm_start(run)
        lines = [r.getMessage() for r in caplog.records if r.name == "loongsage.controller.lifecycle"]
        progress = [line for line in lines if "/30 loss" in line]
        steps = [int(line.split("step ")[1].split("/")[0]) for line in progress]
        assert progress and steps == sorted(set(steps)) and all(1 <= s <= 30 for s in steps), lines  # one line per new step
        assert "nan" not in " ".join(progress), lines
        assert min(steps) < 30, lines  # seen while train_sft ran, not after it
        assert lines[-1].startswith("sft warm start: loss ") and lines[-1].endswith("in 30 steps")
        assert ray.get(actor.inspect.remote(sft_progress))["step"] == 30
    finally:
        if actor is not None:
            ray.kill(actor)
