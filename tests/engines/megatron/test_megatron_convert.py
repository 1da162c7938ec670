"""HF <-> Megatron-Core conversion and the megatron engine at tp=1, against transformers.

Real megatron-core 0.16.1 on CPU (one gloo rank): the tiny Qwen2 (QKV bias, tied
embeddings) and seeded tiny Llama (untied), Qwen3 (q/k norm) and Qwen3-MoE (top-2 of 4
experts) checkpoints. Conversion must round-trip bitwise, through a TP=2 split too; the
engine's log-probs and entropy must equal the embedded engine's (transformers' forward) within
1e-5 in fp32; one train step must move the weights as the embedded step does; the weights it
exports must carry the embedded engine's names, order and values; its HF export must load in
transformers.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from loongsage.engines.batch import TrainBatch
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.engines.megatron.convert import hf_to_megatron, megatron_to_hf, tp_merge, tp_shard
from loongsage.engines.megatron.engine import MegatronTrainEngine
from loongsage.engines.megatron.model import read_hf
from loongsage.schema import ModelConfig, TrainConfig

FAMILIES = ["qwen2", "llama", "qwen3", "qwen3_moe"]


def ragged_batch(n: int = 5, length: int = 14, seed: int = 0) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 500, (n, length), generator=g)
    attn = torch.ones(n, length, dtype=torch.long)
    for row in range(n):
        attn[row, length - 2 * row:] = 0
    ids = ids.masked_fill(attn == 0, 0)
    loss_mask = attn.float()
    loss_mask[:, : length // 3] = 0
    return TrainBatch(ids, attn, loss_mask, {"advantages": torch.linspace(-1, 1, n)})


def engines(path, **train):
    train = {"micro_batch_size": 2, "num_threads": 1, **train}
    return (MegatronTrainEngine(ModelConfig(path=str(path)), TrainConfig(**train)),
            EmbeddedTrainEngine(ModelConfig(path=str(path)), TrainConfig(**train), device="cpu"))


def pg_loss(ctx):
    adv = ctx.batch.extras["advantages"][:, None]
    loss = -(adv * ctx.logprobs * ctx.batch.loss_mask).sum() / ctx.global_num_tokens
    return loss, {"tokens": ctx.batch.loss_mask.sum() / ctx.global_num_tokens}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tp", [1, 2])
def test_round_trip_is_bitwise(tiny_family, family, tp):
    """Against transformers' own in-memory state dict (fused experts, tied lm_head left out)."""
    from transformers import AutoModelForCausalLM

    config, on_disk = read_hf(tiny_family[family])
    hf = AutoModelForCausalLM.from_pretrained(tiny_family[family]).state_dict()
    mc = hf_to_megatron(on_disk, config)
    assert all(torch.equal(mc[k], v) for k, v in hf_to_megatron(hf, config).items())
    merged = {name: tp_merge(name, [tp_shard(name, t, r, tp) for r in range(tp)]) for name, t in mc.items()}
    back = megatron_to_hf(merged, config)
    expected = {k: v for k, v in hf.items() if not (config.tie_word_embeddings and k == "lm_head.weight")}
    assert sorted(back) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(back[name], tensor), name


def test_qkv_is_grouped_by_kv_head(tiny_family):
    """Megatron's fused QKV rows: per KV group its query heads, then its key, then its value."""
    config, hf = read_hf(tiny_family["llama"])
    qkv = hf_to_megatron(hf, config)["decoder.layers.0.self_attention.linear_qkv.weight"]
    d, heads_per_group = 16, 2
    q, k, v = (hf[f"model.layers.0.self_attn.{x}_proj.weight"] for x in "qkv")
    block = (heads_per_group + 2) * d
    for g in range(2):
        rows = qkv[g * block:(g + 1) * block]
        assert torch.equal(rows[: heads_per_group * d], q[g * heads_per_group * d:(g + 1) * heads_per_group * d])
        assert torch.equal(rows[heads_per_group * d: heads_per_group * d + d], k[g * d:(g + 1) * d])
        assert torch.equal(rows[-d:], v[g * d:(g + 1) * d])
    # a TP=2 rank holds whole groups: rank 1's piece is group 1's block
    assert torch.equal(tp_shard("x.linear_qkv.weight", qkv, 1, 2), qkv[block:])


@pytest.mark.parametrize("family", FAMILIES)
def test_logprobs_and_export_match_the_embedded_engine(tiny_family, family):
    megatron, embedded = engines(tiny_family[family])
    batch = ragged_batch()
    ours = megatron.compute_logprobs(batch, with_entropy=True)
    theirs = embedded.compute_logprobs(batch, with_entropy=True)
    assert (ours["logprobs"] - theirs["logprobs"]).abs().max() < 1e-5
    assert (ours["entropy"] - theirs["entropy"]).abs().max() < 1e-5
    assert ours["logprobs"][:, 0].abs().max() == 0 and ours["logprobs"][4, -8:].abs().max() == 0
    sent, expected = list(megatron.named_tensors(include_tied=False)), list(embedded.named_tensors(include_tied=False))
    assert [n for n, _ in sent] == [n for n, _ in expected]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(sent, expected))


@pytest.mark.parametrize("family", ["qwen2", "qwen3_moe"])
def test_train_step_updates_like_the_embedded_engine(tiny_family, family):
    """Two mini-batches of micro-batches of 2; eps=1 and no clipping keep the update close to
    lr x gradient, so a wrongly scaled gradient would move weights far beyond the bound."""
    megatron, embedded = engines(tiny_family[family], lr=0.05, eps=1.0, grad_clip=0.0)
    batch = ragged_batch(6)
    ours, theirs = megatron.train_step(batch, pg_loss, 2), embedded.train_step(batch, pg_loss, 2)
    for key in ("train/loss", "train/grad_norm", "train/tokens", "train/num_tokens", "train/entropy"):
        assert ours[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-6), key
    after, expected = dict(megatron.named_tensors()), dict(embedded.named_tensors())
    start = dict(EmbeddedTrainEngine(ModelConfig(path=str(tiny_family[family])), TrainConfig()).named_tensors())
    moved = max(float((expected[k] - start[k]).abs().max()) for k in start)
    assert moved > 1e-3  # the step did something the comparison can see
    assert max(float((after[k] - expected[k]).abs().max()) for k in expected) < 1e-5


def test_grad_clip_matches_the_embedded_engine(tiny_family):
    megatron, embedded = engines(tiny_family["qwen2"], lr=0.05, eps=1.0, grad_clip=0.5)
    batch = ragged_batch(4)
    ours, theirs = megatron.train_step(batch, pg_loss), embedded.train_step(batch, pg_loss)
    assert ours["train/grad_norm"] == pytest.approx(theirs["train/grad_norm"], rel=1e-5)
    after, expected = dict(megatron.named_tensors()), dict(embedded.named_tensors())
    assert max(float((after[k] - expected[k]).abs().max()) for k in expected) < 1e-5


def test_hf_export_loads_in_transformers(tiny_family, tmp_path):
    from transformers import AutoModelForCausalLM

    megatron, embedded = engines(tiny_family["llama"], lr=0.05)
    batch = ragged_batch(4)
    megatron.train_step(batch, pg_loss)
    megatron.save(tmp_path / "ckpt")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    exported = dict(megatron.named_tensors())
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, exported[name]), name
    hidden = megatron.final_hidden_states(batch)
    out = loaded.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    real = batch.attention_mask.bool()
    assert (hidden[real] - out.last_hidden_state[real]).abs().max() < 1e-5


def test_resume_restores_weights_and_adamw_moments(tiny_family, tmp_path):
    """Continuing after ``load`` takes the very step the saving engine takes next; with the
    AdamW moments restarted it would not (their first step is lr x sign(gradient))."""
    path = tiny_family["qwen2"]
    first, _ = engines(path, lr=0.01)
    first.train_step(ragged_batch(4), pg_loss)
    first.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "megatron_optimizer" / "rank_0.pt").is_file()
    first.train_step(ragged_batch(4, seed=1), pg_loss)
    resumed = MegatronTrainEngine(ModelConfig(path=str(path)), TrainConfig(micro_batch_size=2, lr=0.01))
    resumed.load(tmp_path / "ckpt")
    assert resumed.weight_version == 1
    resumed.train_step(ragged_batch(4, seed=1), pg_loss)
    expected = dict(first.named_tensors())
    for name, tensor in resumed.named_tensors():
        assert torch.equal(tensor, expected[name]), name


def test_routed_experts_are_the_experts_transformers_routes_to(tiny_family):
    """Per token and MoE layer, the recorded top-2 experts are those of HF's own router
    (softmax over the gate's logits, top-k), read from the same tokens in transformers."""
    from transformers import AutoModelForCausalLM

    megatron, _ = engines(tiny_family["qwen3_moe"])
    batch = ragged_batch()
    recorded = megatron.routed_experts(batch)
    assert recorded.shape == (5, 14, 2, 2)
    hf = AutoModelForCausalLM.from_pretrained(tiny_family["qwen3_moe"])
    inputs: list[torch.Tensor] = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, a, o: inputs.append((a[0], m.weight)))
             for layer in hf.model.layers]
    with torch.no_grad():
        hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    for hook in hooks:
        hook.remove()
    real = batch.attention_mask.bool()
    for layer, (hidden, weight) in enumerate(inputs):
        logits = torch.nn.functional.linear(hidden.reshape(-1, hidden.shape[-1]), weight)
        expected = logits.softmax(-1).topk(2).indices.sort(-1).values.view(5, 14, 2)
        assert torch.equal(recorded[:, :, layer][real], expected[real]), layer
    assert (recorded[~real] == -1).all()
    assert len(set(recorded[real].flatten().tolist())) == 4  # every expert got tokens
