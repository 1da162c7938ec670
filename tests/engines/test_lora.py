"""LoRA (``train.lora``) on the embedded train engine with the tiny Qwen2, against a real embedded
rollout engine over HTTP: only adapters train, only adapter bytes are sent, the engine's
log-probs equal those of the same engine loaded with peft's merged weights (1e-6) and of the
merged model's full forward (1e-5), the reference is the base with adapters off, checkpoints
hold a peft-loadable adapter."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from loongsage.config.compose import load_config
from loongsage.engines.batch import TrainBatch
from loongsage.engines.client import EngineClient
from loongsage.engines.embedded_rollout import EmbeddedRolloutEngine
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.errors import ConfigError
from loongsage.schema import LoraSettings, ModelConfig, TrainConfig

PROMPT = [5, 17, 42, 99, 7, 64, 3, 250]
# alpha / rank = 3, not a power of two: scaling·B·A and (B·A)·scaling then round differently,
# so the merges compared below are not bit-identical by construction
LORA = LoraSettings(rank=4, alpha=12.0, target_modules=["q_proj", "v_proj", "up_proj"])


def lora_engine(path, **lora) -> EmbeddedTrainEngine:
    settings = LoraSettings(**{**LORA.__dict__, **lora})
    return EmbeddedTrainEngine(ModelConfig(path=str(path)), TrainConfig(lr=5e-3, lora=settings), device="cpu")


def batch_of(ids: list[int]) -> TrainBatch:
    t = torch.tensor([ids])
    mask = torch.zeros(t.shape)
    mask[0, len(PROMPT):] = 1
    return TrainBatch(t, torch.ones_like(t), mask, {})


def nll(ctx):
    return -(ctx.logprobs * ctx.batch.loss_mask).sum() / ctx.global_num_tokens


def trained(path, steps=3, **lora) -> EmbeddedTrainEngine:
    engine = lora_engine(path, **lora)
    batch = batch_of(PROMPT + [11, 12, 13, 14, 15, 16])
    for _ in range(steps):
        engine.train_step(batch, nll)
    return engine


def hf_logprobs(model, ids: list[int], start: int) -> torch.Tensor:
    with torch.no_grad():
        logp = model(torch.tensor([ids])).logits.float().log_softmax(-1)[0]
    return torch.stack([logp[i - 1, ids[i]] for i in range(start, len(ids))])


def engine_output(path, weights=(), syncs: int = 0):
    """10 tokens sampled (the request's sampling seed 2: engines.sampling_seed) by an embedded
    rollout engine over HTTP loaded from ``path``, after ``syncs`` weight syncs of ``weights``;
    and the weights the engine then held."""
    rollout = EmbeddedRolloutEngine(str(path), num_threads=1, seed=2)
    rollout.start()
    try:
        with EngineClient(rollout.url, timeout=120) as client:
            for _ in range(syncs):
                client.update_weights_from_tensor(list(weights), weight_version=1)
            out = client.generate(PROMPT, {"max_new_tokens": 10, "ignore_eos": True, "sampling_seed": 2})
        return out, rollout.model.state_dict()
    finally:
        rollout.stop()


def peft_merged(path, engine: EmbeddedTrainEngine, folder) -> torch.nn.Module:
    """An independent merge: peft loads the saved adapter onto the base and merges it."""
    from peft import PeftModel

    engine.save(folder)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return PeftModel.from_pretrained(base, str(folder)).merge_and_unload().eval()


def test_training_changes_only_adapter_tensors(tiny_model_dir):
    engine = lora_engine(tiny_model_dir)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    optimized = {id(p) for g in engine.optimizer.param_groups for p in g["params"]}
    assert optimized == {id(p) for n, p in engine.model.named_parameters() if ".lora_" in n}
    batch = batch_of(PROMPT + [11, 12, 13, 14])
    for _ in range(2):
        engine.train_step(batch, nll)
    after = engine.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".lora_" in k for k in changed)
    assert any(".lora_B." in k for k in changed)  # B starts at 0: the update really moved it


def test_engine_receives_only_adapter_bytes_and_matches_a_merged_model(tiny_model_dir, tmp_path):
    engine = trained(tiny_model_dir)
    sent = list(engine.named_tensors(include_tied=False))
    assert sent and all(n.endswith((".lora_A", ".lora_B", ".lora_scaling")) for n, _ in sent)
    assert {float(t) for n, t in sent if n.endswith(".lora_scaling")} == {3.0}
    adapter_bytes = sum(p.numel() * p.element_size() for n, p in engine.model.named_parameters() if ".lora_" in n)
    modules = len(engine.lora.layers)
    assert sum(t.numel() * t.element_size() for _, t in sent) == adapter_bytes + 8 * modules  # + one float64 each
    full = sum(t.numel() * t.element_size() for _, t in engine._state_tensors(include_tied=False))
    assert adapter_bytes < full / 50

    out, held = engine_output(tiny_model_dir, sent, syncs=2)  # a second sync merges into the same base
    ids = PROMPT + out.output_ids
    merged = peft_merged(tiny_model_dir, engine, tmp_path / "adapter")
    # the engine holds peft's merge bit for bit ((B·A)·scaling, engines.lora.lora_delta), so the
    # same engine loaded with the merged weights (same decode numerics, same sampling seed)
    # samples the same tokens with the same log-probs
    expected = merged.state_dict()
    assert set(held) == set(expected)
    assert [name for name, tensor in held.items() if not torch.equal(tensor, expected[name])] == []
    merged.save_pretrained(tmp_path / "merged")
    same, _ = engine_output(tmp_path / "merged")
    assert same.output_ids == out.output_ids and same.output_logprobs == out.output_logprobs
    # and a full forward of the merged model, and the trainer (adapters unmerged)
    engine_lp = torch.tensor(out.output_logprobs)
    torch.testing.assert_close(engine_lp, hf_logprobs(merged, ids, len(PROMPT)), atol=1e-5, rtol=0)
    train_lp = engine.compute_logprobs(batch_of(ids))["logprobs"][0, len(PROMPT):]
    torch.testing.assert_close(engine_lp, train_lp, atol=1e-5, rtol=0)


def test_merged_sync_sends_the_merged_hf_state_dict(tiny_model_dir, tmp_path):
    engine = trained(tiny_model_dir, sync="merged")
    merged = peft_merged(tiny_model_dir, engine, tmp_path / "adapter")
    sent = dict(engine.named_tensors(include_tied=False))
    expected = merged.state_dict()
    assert set(sent) == set(expected) - {"lm_head.weight"}  # tied: sent once
    assert [name for name, tensor in sent.items() if not torch.equal(tensor, expected[name])] == []


def test_reference_is_the_base_model_with_adapters_off(tiny_model_dir):
    engine = trained(tiny_model_dir)
    ids = PROMPT + [21, 22, 23]
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ref = engine.compute_ref_logprobs(batch_of(ids))[0, len(PROMPT):]
    torch.testing.assert_close(ref, hf_logprobs(base, ids, len(PROMPT)), atol=1e-5, rtol=0)
    policy = engine.compute_logprobs(batch_of(ids))["logprobs"][0, len(PROMPT):]
    assert (policy - ref).abs().max() > 1e-3  # the adapters are back on afterwards
    assert engine._ref is None  # no second copy was loaded


def test_checkpoint_holds_the_adapter_and_resumes_it(tiny_model_dir, tmp_path):
    engine = trained(tiny_model_dir)
    folder = engine.save(tmp_path / "ckpt")
    assert (folder / "adapter_model.safetensors").is_file() and (folder / "adapter_config.json").is_file()
    assert not (folder / "model.safetensors").exists()
    resumed = lora_engine(tiny_model_dir)
    resumed.load(folder)
    ids = PROMPT + [31, 32, 33, 34]
    assert resumed.weight_version == engine.weight_version == 3
    torch.testing.assert_close(resumed.compute_logprobs(batch_of(ids))["logprobs"],
                               engine.compute_logprobs(batch_of(ids))["logprobs"], atol=0, rtol=0)
    batch = batch_of(ids)
    assert resumed.train_step(batch, nll)["train/loss"] == pytest.approx(engine.train_step(batch, nll)["train/loss"])


def test_bad_lora_settings_and_backends_without_lora_are_refused(tiny_model_dir):
    with pytest.raises(ConfigError, match="train.lora.sync"):
        lora_engine(tiny_model_dir, sync="delta")
    with pytest.raises(ConfigError, match="train.lora.target_modules"):
        lora_engine(tiny_model_dir, target_modules=["no_such_proj"])
    with pytest.raises(ConfigError, match="train.lora.rank.*'embedded_rollout' has no LoRA support"):
        load_config("tiny/grpo", ["train.lora.rank=4", "train.backend=embedded_rollout"])
