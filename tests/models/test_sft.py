"""Supervised warm start through the train engine: answer-only loss, loss goes down."""

from __future__ import annotations

import torch

from loongsage.config.schema import ModelConfig, TrainConfig
from loongsage.data.types import Prompt
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.models.sft import run_sft, sft_batch, sft_examples, train_sft


def examples(n=12):
    out = []
    for i in range(n):
        a, b = i % 7 + 1, (3 * i) % 5 + 2
        msgs = [{"role": "user", "content": f"What is {a} + {b}?"}]
        out.append((msgs, f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}."))
    return out


def test_loss_mask_covers_exactly_answer_and_eos(tiny_model_dir):
    engine = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)), TrainConfig(), device="cpu")
    tok = engine.tokenizer
    ex = examples(3)
    batch = sft_batch(tok, ex)
    for row, (msgs, answer) in enumerate(ex):
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
    assert train_sft(engine, data, 1, 2, 1e-3)[0] < losses[0]  # same loop, engine's tokenizer


class _Source:
    def __init__(self, name, size):
        self.name, self._size = name, size

    def size(self):
        return self._size

    def get(self, index):
        meta = {"solution": f"sol {index}"} if self.name == "a" else {}
        messages = [{"role": "user", "content": f"{self.name}{index}"}]
        return Prompt(self.name, index, messages, str(index), meta)


def test_sft_examples_alternate_sources_and_use_solutions():
    sources = {"a": _Source("a", 50), "b": _Source("b", None)}
    ex = sft_examples(sources, 6, seed=3)
    assert ex == sft_examples(sources, 6, seed=3)
    assert [m[0]["content"][0] for m, _ in ex] == ["a", "b"] * 3
    for messages, answer in ex:
        index = messages[0]["content"][1:]
        from_a = messages[0]["content"][0] == "a"
        assert answer == (f"sol {index}" if from_a else f"\\boxed{{{index}}}")
    assert [m[0]["content"] for m, _ in ex[1::2]] == ["b0", "b1", "b2"]
    assert torch.tensor([int(m[0]["content"][1:]) for m, _ in ex[::2]]).lt(50).all()
