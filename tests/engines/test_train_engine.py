"""EmbeddedTrainEngine on the tiny Qwen2: logprobs, gradients, steps, weights, checkpoints."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from loongsage.schema import ModelConfig, TrainConfig
from loongsage.engines.batch import TrainBatch
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.errors import ConfigError, NonFiniteLossError
from loongsage.plugins import get_registries


def make_engine(path, **train) -> EmbeddedTrainEngine:
    return EmbeddedTrainEngine(ModelConfig(path=str(path)), TrainConfig(**train), device="cpu")


def ragged_batch(n=4, length=20, seed=0) -> TrainBatch:
    """Right-padded rows of different lengths; the last half of each row is 'response'."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 500, (n, length), generator=g)
    lengths = [length - 3 * i for i in range(n)]
    attn = torch.zeros(n, length, dtype=torch.long)
    mask = torch.zeros(n, length)
    for row, k in enumerate(lengths):
        attn[row, :k] = 1
        mask[row, k // 2 : k] = 1.0
        ids[row, k:] = 0
    return TrainBatch(ids, attn, mask, {"advantages": torch.linspace(-1, 1, n)})


def token_mean_nll(ctx):
    loss = -(ctx.logprobs * ctx.batch.loss_mask).sum() / ctx.global_num_tokens
    adv = ctx.batch.extras["advantages"][:, None] * ctx.batch.loss_mask
    share = adv.sum() / ctx.global_num_tokens
    return loss, {"nll": loss.detach(), "adv_token_mean": share}


def params_of(engine):
    return {k: v.clone() for k, v in engine.model.state_dict().items()}


def test_registered_as_engine():
    assert get_registries().engine.get("embedded_train") is EmbeddedTrainEngine


def test_logprobs_equal_direct_hf_forward(tiny_model_dir):
    engine = make_engine(tiny_model_dir, micro_batch_size=3)
    batch = ragged_batch()
    out = engine.compute_logprobs(batch, with_entropy=True)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    for row in range(len(batch)):
        k = int(batch.attention_mask[row].sum())
        ids = batch.input_ids[row : row + 1, :k]
        with torch.no_grad():
            logp = torch.log_softmax(hf(ids).logits.float(), -1)[0, :-1]
        scored = batch.loss_mask[row, 1:k] > 0  # the LM head runs over loss-mask positions only
        expected = logp.gather(-1, ids[0, 1:, None])[:, 0]
        torch.testing.assert_close(out["logprobs"][row, 1:k][scored], expected[scored], atol=1e-5, rtol=0)
        entropy = -(logp.exp() * logp).sum(-1)
        torch.testing.assert_close(out["entropy"][row, 1:k][scored], entropy[scored], atol=1e-4, rtol=0)
        assert (out["logprobs"][row, 1:k][~scored] == 0).all() and scored.any() and (~scored).any()
    assert (out["logprobs"][:, 0] == 0).all()
    assert out["logprobs"].dtype == torch.float32 and out["logprobs"].shape == batch.input_ids.shape


def test_train_entropy_is_the_mean_token_entropy_over_the_loss_mask(tiny_model_dir):
    """``train/entropy`` of a step: the policy's per-token entropy at the weights it stepped from,
    averaged over the loss mask, against a direct full-vocabulary computation; split into micro-
    batches it is still the batch's token mean, and the loss closure never sees it."""
    batch = ragged_batch(n=6)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    total, count = 0.0, 0.0
    for row in range(len(batch)):
        k = int(batch.attention_mask[row].sum())
        with torch.no_grad():
            logp = torch.log_softmax(hf(batch.input_ids[row : row + 1, :k]).logits.float(), -1)[0, :-1]
        mask = batch.loss_mask[row, 1:k]
        total += float((-(logp.exp() * logp).sum(-1) * mask).sum())
        count += float(mask.sum())
    seen = []

    def loss_seeing_entropy(ctx):
        seen.append(ctx.entropy)
        return token_mean_nll(ctx)

    for micro in (6, 2):
        metrics = make_engine(tiny_model_dir, micro_batch_size=micro).train_step(batch, loss_seeing_entropy)
        assert metrics["train/entropy"] == pytest.approx(total / count, rel=1e-4)
    assert seen and all(entropy is None for entropy in seen)


def _sgd_step_delta(path, micro, mini_batches=1):
    """Parameter change after one plain SGD(lr=1) step = minus the accumulated gradient."""
    engine = make_engine(path, micro_batch_size=micro, grad_clip=0.0)
    engine.optimizer = torch.optim.SGD(engine.model.parameters(), lr=1.0)
    before = params_of(engine)
    metrics = engine.train_step(ragged_batch(n=6), token_mean_nll, mini_batches=mini_batches)
    after = params_of(engine)
    return {k: after[k] - before[k] for k in before}, metrics, engine


def test_gradient_is_invariant_to_micro_batch_split(tiny_model_dir):
    full, m_full, _ = _sgd_step_delta(tiny_model_dir, micro=6)
    split, m_split, _ = _sgd_step_delta(tiny_model_dir, micro=4)  # uneven: 4 + 2 rows
    single, m_single, _ = _sgd_step_delta(tiny_model_dir, micro=1)
    assert max(v.abs().max().item() for v in full.values()) > 1e-4  # the step did move weights
    for name in full:
        torch.testing.assert_close(split[name], full[name], atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(single[name], full[name], atol=1e-6, rtol=1e-4)
    for m in (m_split, m_single):
        assert m["train/loss"] == pytest.approx(m_full["train/loss"], rel=1e-5)
        assert m["train/grad_norm"] == pytest.approx(m_full["train/grad_norm"], rel=1e-4)
        assert m["train/nll"] == pytest.approx(m_full["train/nll"], rel=1e-5)
        assert m["train/adv_token_mean"] == pytest.approx(m_full["train/adv_token_mean"], rel=1e-5)
    b = ragged_batch(n=6)  # metrics are additive shares: summed over micro-batches
    expected = (b.extras["advantages"][:, None] * b.loss_mask).sum() / b.loss_mask.sum()
    assert m_single["train/adv_token_mean"] == pytest.approx(float(expected), rel=1e-5)
    assert m_single["train/nll"] == pytest.approx(m_single["train/loss"], rel=1e-6)
    assert m_full["train/num_tokens"] == float(ragged_batch(n=6).loss_mask.sum())


def test_mini_batches_take_one_optimizer_step_each(tiny_model_dir):
    engine = make_engine(tiny_model_dir, micro_batch_size=2, lr=1e-3)
    batch = ragged_batch(n=6)
    first = engine.train_step(batch, token_mean_nll, mini_batches=3)
    assert engine.weight_version == 3
    assert first["train/lr"] == 1e-3
    second = engine.train_step(batch, token_mean_nll, mini_batches=3)
    assert second["train/loss"] < first["train/loss"] - 0.1
    assert first["train/optimizer_steps"] == 3.0
    assert engine.train_step(batch.rows(slice(0, 2)), token_mean_nll, 3)["train/optimizer_steps"] == 2
    assert engine.weight_version == 8
    with pytest.raises(ConfigError, match="train.mini_batches_per_step"):
        engine.train_step(batch, token_mean_nll, mini_batches=0)


def test_grad_clip_bounds_the_update(tiny_model_dir):
    clipped, m, _ = _sgd_step_delta(tiny_model_dir, micro=6)
    engine = make_engine(tiny_model_dir, micro_batch_size=6, grad_clip=0.5)
    engine.optimizer = torch.optim.SGD(engine.model.parameters(), lr=1.0)
    before = params_of(engine)
    m2 = engine.train_step(ragged_batch(n=6), token_mean_nll)
    delta = [engine.model.state_dict()[k] - before[k] for k in before if k != "lm_head.weight"]
    norm = torch.sqrt(sum((d.double() ** 2).sum() for d in delta)).item()
    assert m2["train/grad_norm"] == pytest.approx(m["train/grad_norm"], rel=1e-5)  # pre-clip norm
    assert m["train/grad_norm"] > 0.5
    assert norm == pytest.approx(0.5, rel=1e-3)


def _nan_kl_term(ctx):
    """A finite policy-gradient term plus a KL term that is NaN (as inf · 0 would make it)."""
    pg, _ = token_mean_nll(ctx)
    kl = ctx.logprobs.sum() * float("nan")
    return pg + kl, {"train/pg_loss": float(pg.detach()), "train/kl_loss": float(kl.detach())}


def _infinite_gradient(ctx):
    """A finite loss value whose gradient is infinite: d/dx sqrt(x) at x = 0."""
    zero = (ctx.logprobs * 0.0).sum()
    loss = token_mean_nll(ctx)[0] + torch.sqrt(zero)
    return loss, {"train/nll": float(loss.detach())}


def test_non_finite_loss_fails_naming_the_term_and_leaves_the_weights(tiny_model_dir):
    engine = make_engine(tiny_model_dir, micro_batch_size=2)
    engine.train_step(ragged_batch(), token_mean_nll)
    before = params_of(engine)
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss at optimizer step 2: .*train/kl_loss=nan") as err:
        engine.train_step(ragged_batch(), _nan_kl_term)
    assert set(err.value.terms) == {"train/loss", "train/kl_loss"} and err.value.step == 2
    assert engine.weight_version == 1
    for k, v in engine.model.state_dict().items():
        assert torch.equal(v, before[k])
    assert engine.train_step(ragged_batch(), token_mean_nll)["train/loss"] > 0  # still usable
    assert engine.weight_version == 2


def test_non_finite_gradient_fails_naming_the_parameters(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    before = params_of(engine)
    with pytest.raises(NonFiniteLossError, match=r"non-finite gradient at optimizer step 1: train/grad_norm=") as err:
        engine.train_step(ragged_batch(), _infinite_gradient)
    assert any(name.startswith("grad[model.") for name in err.value.terms)
    assert "train/nll" not in err.value.terms  # the loss value itself was finite
    assert engine.weight_version == 0
    for k, v in engine.model.state_dict().items():
        assert torch.equal(v, before[k])


def test_reference_logprobs_stay_at_the_initial_policy(tiny_model_dir):
    engine = make_engine(tiny_model_dir, lr=1e-3)
    batch = ragged_batch()
    initial = engine.compute_logprobs(batch)["logprobs"]
    for _ in range(3):
        engine.train_step(batch, token_mean_nll)
    moved = engine.compute_logprobs(batch)["logprobs"]
    assert (moved - initial).abs().max() > 0.05
    ref = engine.compute_ref_logprobs(batch)
    torch.testing.assert_close(ref, initial, atol=1e-6, rtol=0)
    assert not any(p.requires_grad for p in engine._ref.parameters())


def test_named_tensors_and_numpy_state_match_hf_state_dict(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    named = dict(engine.named_tensors())
    assert list(named) == list(hf)
    state = engine.state_numpy()
    assert list(state) == [k for k in hf if k != "lm_head.weight"]  # tied copy left out
    assert list(engine.state_numpy(include_tied=True)) == list(hf)
    for k, v in hf.items():
        assert torch.equal(named[k], v)
        assert not named[k].requires_grad
    for k, v in state.items():
        assert torch.equal(torch.from_numpy(v), hf[k])


def test_save_load_round_trip_is_bitwise_and_resumes_exactly(tiny_model_dir, tmp_path):
    batch = ragged_batch()
    a = make_engine(tiny_model_dir, lr=1e-3, micro_batch_size=2)
    a.train_step(batch, token_mean_nll)
    a.save(tmp_path / "ckpt")
    saved = params_of(a)
    a.train_step(batch, token_mean_nll)

    b = make_engine(tiny_model_dir, lr=1e-3, micro_batch_size=2)
    b.load(tmp_path / "ckpt")
    assert b.weight_version == 1
    for k, v in b.model.state_dict().items():
        assert torch.equal(v, saved[k]), k
    b.train_step(batch, token_mean_nll)  # Adam moments restored: the next step is identical
    for k, v in b.model.state_dict().items():
        assert torch.equal(v, a.model.state_dict()[k]), k
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").state_dict()
    assert all(torch.equal(hf[k], saved[k]) for k in saved)


def test_from_config_reads_sections_and_rejects_unknown_fields(tiny_model_dir):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({
        "model": {"path": str(tiny_model_dir)},
        "train": {"lr": 3e-4, "betas": [0.8, 0.9], "micro_batch_size": 5},
        "trainer": {"seed": 1},
    })
    engine = EmbeddedTrainEngine.from_config(cfg, device="cpu")
    group = engine.optimizer.param_groups[0]
    assert (group["lr"], group["betas"], engine.train_cfg.micro_batch_size) == (3e-4, (0.8, 0.9), 5)
    with pytest.raises(ConfigError, match="^train: .*micro_batch"):
        EmbeddedTrainEngine.from_config(
            {"model": {"path": str(tiny_model_dir)}, "train": {"micro_batch": 2}}
        )
    with pytest.raises(ConfigError, match="model.dtype"):
        EmbeddedTrainEngine.from_config({"model": {"path": str(tiny_model_dir), "dtype": "fp8"}})


@pytest.mark.parametrize("fp32_lm_head", [True, False])
def test_bf16_model_lm_head_precision_follows_config(tiny_model_dir, fp32_lm_head):
    model_cfg = ModelConfig(path=str(tiny_model_dir), dtype="bfloat16", fp32_lm_head=fp32_lm_head)
    engine = EmbeddedTrainEngine(model_cfg, TrainConfig(), device="cpu")
    assert engine.model.dtype == torch.bfloat16
    batch = ragged_batch(n=1)
    got = engine.compute_logprobs(batch)["logprobs"][0, 1:]
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    with torch.no_grad():
        hidden = hf.model(batch.input_ids).last_hidden_state[0, :-1]
        w = hf.lm_head.weight
        logits = hidden.float() @ w.float().T if fp32_lm_head else (hidden @ w.T).float()
    expected = logits.log_softmax(-1).gather(-1, batch.input_ids[0, 1:, None])[:, 0]
    scored = batch.loss_mask[0, 1:] > 0
    torch.testing.assert_close(got[scored], expected[scored], atol=1e-5, rtol=0)
