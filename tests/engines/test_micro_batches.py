"""Micro-batches that skip padding: the plan, and results unchanged by cropping and packing."""

from __future__ import annotations

import pytest
import torch

from loongsage.engines.batch import TrainBatch
from loongsage.engines import logprobs as engine_logprobs
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.engines.distributed import DDPRanks, FSDP2Ranks, SingleProcess
from loongsage.engines.logprobs import body_hidden, packable, packing_pays
from loongsage.engines.micro_batches import (
    cropped, micro_batches, plan_micro_batches, prompt_keys, row_lengths, scatter_rows, shared_prefix_length,
    split_to,
)
from loongsage.errors import ConfigError
from loongsage.schema import ModelConfig, TrainConfig


def ragged(lengths: list[int], width: int = 40, seed: int = 0) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    n = len(lengths)
    ids = torch.randint(3, 500, (n, width), generator=g)
    attn, mask = torch.zeros(n, width, dtype=torch.long), torch.zeros(n, width)
    for row, k in enumerate(lengths):
        attn[row, :k] = 1
        mask[row, k // 2:k] = 1.0
        ids[row, k:] = 0
    extras = {"advantages": torch.linspace(-1, 1, n)[:, None].expand(n, width) * mask,
              "per_row": torch.arange(n, dtype=torch.float32)}
    return TrainBatch(ids, attn, mask, extras)


def test_the_token_budget_packs_rows_of_alike_length_longest_first():
    lengths = torch.tensor([10, 40, 12, 38, 11, 9])
    plans = plan_micro_batches(lengths, rows_per_micro_batch=2, token_budget=80)
    assert [p.tolist() for p in plans] == [[1, 3], [2, 4, 0, 5]]  # 2 x 40 <= 80; 4 x 12 <= 80
    for plan in plans:
        assert len(plan) * int(lengths[plan].max()) <= 80
    assert [p.tolist() for p in plan_micro_batches(torch.tensor([50, 5]), 4, 30)] == [[0], [1]]  # too long: alone
    assert [p.tolist() for p in plan_micro_batches(lengths, 4, 0)] == [[0, 1, 2, 3], [4, 5]]  # no budget: rows


def test_a_micro_batch_is_cropped_to_its_longest_row_and_scattered_back():
    batch = ragged([7, 20, 5])
    assert row_lengths(batch).tolist() == [7, 20, 5]
    pieces = micro_batches(batch, [torch.tensor([0, 2]), torch.tensor([1])])
    assert [m.input_ids.shape[1] for _, m in pieces] == [7, 20]
    assert pieces[0][1].extras["advantages"].shape == (2, 7) and pieces[0][1].extras["per_row"].tolist() == [0, 2]
    back = scatter_rows([(rows, m.extras["advantages"]) for rows, m in pieces], 3, 40)
    torch.testing.assert_close(back, batch.extras["advantages"], rtol=0, atol=0)
    short = cropped(batch, 5)
    assert short.loss_mask.shape == short.extras["advantages"].shape == (3, 5) and short.extras["per_row"].shape == (3,)


def test_split_to_gives_data_parallel_ranks_the_same_number_of_micro_batches():
    plans = split_to([torch.tensor([0, 1, 2, 3]), torch.tensor([4])], 4)
    assert len(plans) == 4 and sorted(torch.cat(plans).tolist()) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="cannot cut 2 rows into 3 micro-batches"):
        split_to([torch.tensor([0]), torch.tensor([1])], 3)


def nll(ctx):
    loss = -(ctx.logprobs * ctx.batch.loss_mask * (1 + ctx.batch.extras["advantages"])).sum() / ctx.global_num_tokens
    return loss, {"nll": loss.detach()}


@pytest.mark.parametrize("train", [{"micro_batch_size": 2}, {"max_tokens_per_micro_batch": 64}])
def test_cropped_and_packed_micro_batches_change_no_result(tiny_model_dir, train):
    """Against one uncropped micro-batch holding every row: logprobs, entropy, loss and weights."""
    batch = ragged([9, 40, 14, 33, 6, 21])

    def engine(**options):
        eng = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)),
                                  TrainConfig(lr=1e-2, grad_clip=0.0, **options), device="cpu")
        eng.optimizer = torch.optim.SGD(eng.model.parameters(), lr=1.0)  # the update is the gradient
        return eng

    whole, split = engine(micro_batch_size=len(batch)), engine(**train)
    assert len(split._micro_batches(batch)) > 1
    a, b = whole.compute_logprobs(batch, with_entropy=True), split.compute_logprobs(batch, with_entropy=True)
    for key in ("logprobs", "entropy"):
        torch.testing.assert_close(b[key], a[key], atol=1e-5, rtol=0)
    m_whole, m_split = whole.train_step(batch, nll), split.train_step(batch, nll)
    assert m_split["train/loss"] == pytest.approx(m_whole["train/loss"], rel=1e-5)
    after_whole, after_split = whole.model.state_dict(), split.model.state_dict()
    for name, tensor in after_split.items():
        torch.testing.assert_close(tensor, after_whole[name], atol=1e-5, rtol=1e-4)


def test_a_negative_token_budget_is_refused(tiny_model_dir):
    with pytest.raises(ConfigError, match="train.max_tokens_per_micro_batch"):
        EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)), TrainConfig(max_tokens_per_micro_batch=-1),
                            device="cpu")


def grouped(groups: int = 3, samples: int = 4, prompt: int = 11, width: int = 30) -> TrainBatch:
    """``groups`` prompts x ``samples`` responses of uneven length, groups interleaved row by row."""
    g = torch.Generator().manual_seed(1)
    n = groups * samples
    ids = torch.randint(3, 500, (n, width), generator=g)
    attn, mask = torch.zeros(n, width, dtype=torch.long), torch.zeros(n, width)
    prompts = torch.randint(3, 500, (groups, prompt), generator=g)
    for row in range(n):
        ids[row, :prompt] = prompts[row % groups]
        end = prompt + 4 + (row * 7) % (width - prompt - 4)
        attn[row, :end], mask[row, prompt:end] = 1, 1.0
        ids[row, end:] = 0
    return TrainBatch(ids, attn, mask, {"advantages": torch.linspace(-1, 1, n)[:, None].expand(n, width) * mask})


def test_the_samples_of_a_group_are_planned_together_and_share_their_prompt():
    batch = grouped()
    keys = prompt_keys(batch)
    assert len(set(keys)) == 3 and keys[0] == keys[3] == tuple(batch.input_ids[0, :11].tolist())
    plans = plan_micro_batches(row_lengths(batch), 2, 0, keys)
    assert [p.tolist() for p in plans] == [[0, 3], [6, 9], [1, 4], [7, 10], [2, 5], [8, 11]]
    assert shared_prefix_length(batch.rows(plans[0])) == 11 and shared_prefix_length(batch) == 0
    assert shared_prefix_length(batch.rows(torch.tensor([0]))) == 0  # one row: nothing to share


def test_rows_whose_prompt_no_other_row_holds_are_planned_together():
    keys = ["a", "b", "a", "c", "d", "a"]
    plans = plan_micro_batches(torch.tensor([9, 8, 7, 6, 5, 4]), 2, 0, keys)
    assert [p.tolist() for p in plans] == [[0, 2], [5], [1, 3], [4]]
    sft = grouped(groups=6, samples=1)  # an SFT batch: every row its own prompt
    plans = plan_micro_batches(row_lengths(sft), 4, 0, prompt_keys(sft))
    assert [p.tolist() for p in plans] == [[0, 1, 2, 3], [4, 5]]


def test_rows_of_different_prompts_share_only_the_opening_they_hold_alike(tiny_model_dir):
    batch = grouped(groups=6, samples=1)
    batch.input_ids[:, :5] = batch.input_ids[0, :5]  # a chat template's opening, the rest differs
    calls: list[tuple[int, ...]] = []

    def logprobs(share: bool) -> torch.Tensor:
        eng = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)),
                                  TrainConfig(micro_batch_size=4, share_prompt=share), device="cpu")
        eng.model.base_model.register_forward_pre_hook(
            lambda module, args, kwargs: calls.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
        return eng.compute_logprobs(batch)["logprobs"]

    alone = logprobs(False)
    calls.clear()
    shared = logprobs(True)
    tails = (row_lengths(batch) - 5).tolist()  # each row's tokens after the opening, none of its padding
    assert calls == [(1, 5), (1, sum(tails[:4])), (1, 5), (1, sum(tails[4:]))]
    torch.testing.assert_close(shared, alone, atol=1e-5, rtol=0)


def test_a_prompt_computed_once_gives_the_logprobs_and_gradients_of_every_row_alone(tiny_model_dir):
    batch = grouped()
    calls: list[tuple[int, ...]] = []

    def engine(share: bool) -> EmbeddedTrainEngine:
        eng = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)),
                                  TrainConfig(micro_batch_size=4, grad_clip=0.0, share_prompt=share), device="cpu")
        eng.optimizer = torch.optim.SGD(eng.model.parameters(), lr=1.0)  # the update is the gradient
        return eng

    shared, alone = engine(True), engine(False)
    shared.model.base_model.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    a, b = alone.compute_logprobs(batch, with_entropy=True), shared.compute_logprobs(batch, with_entropy=True)
    replies = int((row_lengths(batch)[[0, 3, 6, 9]] - 11).sum())  # the first micro-batch: group 0's samples
    assert len(set(row_lengths(batch)[[0, 3, 6, 9]].tolist())) > 1  # of unequal lengths: padded, they would pad
    assert calls[:2] == [(1, 11), (1, replies)]  # its prompt once, then its four responses packed on its cache
    for key in ("logprobs", "entropy"):
        torch.testing.assert_close(b[key], a[key], atol=1e-5, rtol=0)
    assert int((a["logprobs"] != 0).sum()) == int(batch.loss_mask.sum())  # every loss token scored, nothing else
    m_alone, m_shared = alone.train_step(batch, nll), shared.train_step(batch, nll)
    assert m_shared["train/loss"] == pytest.approx(m_alone["train/loss"], rel=1e-5)
    assert m_shared["train/grad_norm"] == pytest.approx(m_alone["train/grad_norm"], rel=1e-5)
    after_alone = alone.model.state_dict()
    for name, tensor in shared.model.state_dict().items():
        torch.testing.assert_close(tensor, after_alone[name], atol=1e-5, rtol=1e-4)


def test_replies_are_packed_where_that_costs_fewer_flops():
    def real(lengths: list[int], width: int) -> torch.Tensor:
        return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]

    main_job = real([48, 20, 30, 41, 25, 38, 33, 35], 48)  # 270 real of 384 padded reply tokens
    assert packing_pays(main_job, 60, 576)
    assert not packing_pays(real([48] * 8, 48), 60, 576)  # no padding to save
    agentic = real([2000, 1200, 1500, 1800, 900, 1600, 1400, 1700], 2000)  # long rows: packed attention outgrows it
    assert not packing_pays(agentic, 500, 576)
    assert packing_pays(agentic[:2], 500, 576)


def test_replies_padded_on_the_repeated_cache_give_the_logprobs_of_every_row_alone(tiny_model_dir, monkeypatch):
    batch = grouped()
    alone = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)),
                                TrainConfig(micro_batch_size=4, share_prompt=False), device="cpu")
    shared = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)),
                                 TrainConfig(micro_batch_size=4, share_prompt=True), device="cpu")
    calls: list[tuple[int, ...]] = []
    shared.model.base_model.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    monkeypatch.setattr(engine_logprobs, "packing_pays", lambda *_: False)
    a, b = alone.compute_logprobs(batch, with_entropy=True), shared.compute_logprobs(batch, with_entropy=True)
    longest = int(row_lengths(batch)[[0, 3, 6, 9]].max())
    assert calls[:2] == [(1, 11), (4, longest - 11)]  # the prompt once, then four padded replies on its cache
    for key in ("logprobs", "entropy"):
        torch.testing.assert_close(b[key], a[key], atol=1e-5, rtol=0)


def _row_by_row(model, batch: TrainBatch) -> torch.Tensor:
    lengths = row_lengths(batch).tolist()
    out = torch.zeros(*batch.input_ids.shape, model.config.hidden_size)
    for row, length in enumerate(lengths):
        ids = batch.input_ids[row:row + 1, :length]
        out[row, :length] = body_hidden(model, ids, torch.ones_like(ids), 0)[0]
    return out


def test_a_sliding_window_model_runs_its_replies_padded_and_keeps_its_window():
    """Random-init tiny Mistral, window 4 < the 11-token prompt: a packed sequence's 4D mask
    would be taken as it is (no window) and outrun the layer's 3-key cache."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=500, sliding_window=4)
    model = MistralForCausalLM(config).eval()
    batch = grouped().rows(torch.tensor([0, 3, 6, 9]))  # group 0's samples: an 11-token prompt
    batch = TrainBatch(batch.input_ids[:, :int(row_lengths(batch).max())],
                       batch.attention_mask[:, :int(row_lengths(batch).max())], batch.loss_mask)
    head = model.model(input_ids=batch.input_ids[:1, :11], use_cache=True)
    assert not packable(model, head.cache)
    with torch.no_grad():
        shared = body_hidden(model, batch.input_ids, batch.attention_mask, 11)
        alone = _row_by_row(model, batch)
    real = batch.attention_mask.bool()
    torch.testing.assert_close(shared[real], alone[real], atol=1e-5, rtol=0)


def test_no_prompt_is_shared_where_every_layer_call_is_a_collective(tiny_model_dir):
    eng = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)), TrainConfig(share_prompt=True), device="cpu")
    assert eng._share_prompt and packable(eng.model, eng.model.base_model(
        input_ids=torch.tensor([[3, 4, 5]]), use_cache=True).cache)

    class LayerCollectives(SingleProcess):
        layer_calls_are_collective = True  # FSDP2: a rank that shares a prompt would call every layer once more

    eng.parallel = LayerCollectives()
    assert not eng._share_prompt
    assert FSDP2Ranks.layer_calls_are_collective and not DDPRanks.layer_calls_are_collective
