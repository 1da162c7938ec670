"""Start-up memory estimate (``loongsage.controller.memory_budget``) on the tiny Qwen2.

The activation term is checked against what autograd really keeps for a micro-batch of the
real model; the check against the machine refuses (naming the settings to lower), warns,
or passes.
"""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
import torch

from loongsage.config.compose import load_config
from loongsage.controller.memory import GB
from loongsage.controller.memory_budget import (PROCESS_BYTES, Estimate, ModelShape, check_estimate, estimate_run,
                                                parameter_count, saved_tensor_elements)
from loongsage.engines.embedded_train import load_causal_lm
from loongsage.engines.logprobs import token_logprobs
from loongsage.errors import ConfigError


def tiny_cfg(tiny_model_dir, *overrides):
    return load_config("tiny/grpo", [f"model.path={tiny_model_dir}", *overrides]).cfg


def test_shape_counts_the_real_parameters(tiny_model_dir):
    shape = ModelShape.from_folder(str(tiny_model_dir))
    model = load_causal_lm(tiny_model_dir, "float32")
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    assert (shape.hidden, shape.layers, shape.vocab) == (
        model.config.hidden_size, model.config.num_hidden_layers, model.config.vocab_size)


def test_saved_headers_count_what_the_model_holds(tiny_model_dir, tmp_path):
    """The header count equals the parameters of the loaded model (its tied embedding once), on
    the dense tiny model and the MoE one; a folder without safetensors is counted on the meta
    device instead."""
    from transformers import AutoConfig

    from loongsage.models.tiny_moe import ensure_tiny_moe_model

    for folder in (tiny_model_dir, ensure_tiny_moe_model()):
        model = load_causal_lm(folder, "float32")
        assert saved_tensor_elements(folder) == sum(p.numel() for p in model.parameters())
    expected = saved_tensor_elements(tiny_model_dir)
    config = AutoConfig.from_pretrained(tiny_model_dir)
    config.save_pretrained(tmp_path)
    assert saved_tensor_elements(tmp_path) is None
    assert parameter_count(str(tmp_path), config) == expected
    (tmp_path / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\n")
    assert saved_tensor_elements(tmp_path) is None  # an LFS pointer, not weights
    assert parameter_count(str(tmp_path), config) == expected


def test_a_sharded_checkpoint_counts_its_shards_once(tiny_model_dir, tmp_path):
    """The shards the index maps, once each; a file beside them (an adapter) is not counted."""
    model = load_causal_lm(tiny_model_dir, "float32")
    model.save_pretrained(tmp_path, max_shard_size="1MB")
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    shutil.copy(tmp_path / sorted(p.name for p in tmp_path.glob("model-*.safetensors"))[0],
                tmp_path / "adapter_model.safetensors")
    assert saved_tensor_elements(tmp_path) == sum(p.numel() for p in model.parameters())


def test_activation_term_matches_what_autograd_keeps(tiny_model_dir):
    """Saved activations of one micro-batch vs the estimate's per-token term (1.5x is in flight)."""
    model = load_causal_lm(tiny_model_dir, "float32")
    rows, tokens = 8, 96
    ids = torch.randint(3, 500, (rows, tokens))
    params = {p.data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        if tensor.data_ptr() not in params:
            saved[tensor.data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_logprobs(model, ids, torch.ones_like(ids))
    cfg = tiny_cfg(tiny_model_dir, f"train.micro_batch_size={rows}")
    shape = ModelShape.from_folder(str(tiny_model_dir))
    est = estimate_run(cfg, shape, tokens)
    kept = rows * tokens * shape.layers * (10 * shape.hidden + 4 * shape.intermediate) * 4
    assert 0.75 * kept <= sum(saved.values()) <= 1.25 * kept
    assert est.parts["train actor"] >= 1.5 * kept + 4 * shape.parameters * 4


def test_refuses_warns_or_passes_against_the_room():
    est = Estimate({"train actor": int(6 * GB), "rollout engines": int(2 * GB), "driver and Ray": int(1 * GB)},
                   {"train actor": "1 x (weights, gradients and AdamW 2.0 GB, activations 3.0 GB for 8 rows x 100 tokens)"})
    fits = check_estimate(est, "refuse", room=int(20 * GB), total=int(24 * GB))
    assert fits == ("memory estimate 9.0 GB: train actor 6.0 GB, rollout engines 2.0 GB, driver and Ray 1.0 GB; "
                    "20.0 GB free of 24.0 GB")  # one short line: the parts' sizes only
    assert "8 rows x 100 tokens" in check_estimate(est, "refuse", room=int(10 * GB), total=int(24 * GB))
    assert check_estimate(est, "refuse", room=int(10 * GB), total=int(24 * GB)).startswith("warning:")
    assert check_estimate(est, "warn", room=int(5 * GB), total=int(24 * GB)).startswith("warning:")
    with pytest.raises(ConfigError, match=r"^train\.micro_batch_size: the run needs about memory estimate 9\.0 GB") as err:
        check_estimate(est, "refuse", room=int(5 * GB), total=int(24 * GB))
    assert "rollout.max_running_requests" in str(err.value) and "placement.memory_check=warn" in str(err.value)


def test_estimate_grows_with_the_settings_it_names(tiny_model_dir):
    shape = ModelShape.from_folder(str(tiny_model_dir))
    base = estimate_run(tiny_cfg(tiny_model_dir, "train.share_prompt=false"), shape, 100)
    bigger_micro = estimate_run(tiny_cfg(tiny_model_dir, "train.share_prompt=false", "train.micro_batch_size=64"), shape, 100)
    checkpointed = estimate_run(tiny_cfg(tiny_model_dir, "train.gradient_checkpointing=true"), shape, 100)
    assert bigger_micro.parts["train actor"] > base.parts["train actor"] > checkpointed.parts["train actor"]
    more_requests = estimate_run(tiny_cfg(tiny_model_dir, "rollout.n_samples_per_prompt=32",
                                          "rollout.max_running_requests=256"), shape, 100)
    assert more_requests.parts["rollout engines"] > base.parts["rollout engines"]


def test_a_shared_prompt_counts_once_per_micro_batch_of_one_group(tiny_model_dir):
    """RL micro-batches hold one group at most with train.share_prompt; SFT rows stay whole."""
    shape = ModelShape.from_folder(str(tiny_model_dir))
    rl = ("trainer.sft.steps=0", "train.micro_batch_size=64")  # 8 groups of 8: a micro-batch is one group
    shared = estimate_run(tiny_cfg(tiny_model_dir, *rl), shape, 100, prompt_tokens=60)
    whole = estimate_run(tiny_cfg(tiny_model_dir, *rl, "train.share_prompt=false"), shape, 100, prompt_tokens=60)
    per_token = shape.layers * (10 * shape.hidden + 4 * shape.intermediate) * 4 * 1.5
    gap = whole.parts["train actor"] - shared.parts["train actor"]
    assert gap == pytest.approx((64 * 100 - (60 + 8 * 40)) * per_token * 1.5, rel=0.02)  # slack: half again
    assert "8 rows x 40 reply tokens on one 60-token prompt" in shared.detail["train actor"]
    assert "64 rows x 100 tokens" in whole.detail["train actor"]
    with_sft = estimate_run(tiny_cfg(tiny_model_dir, "train.micro_batch_size=64"), shape, 100, prompt_tokens=60)
    assert "32 rows x 100 tokens (SFT)" in with_sft.detail["train actor"]  # tiny/grpo's warm start: 32 rows
    megatron = estimate_run(tiny_cfg(tiny_model_dir, *rl, "train.backend=megatron"), shape, 100, prompt_tokens=60)
    one_sample = load_config("tiny/sao", [f"model.path={tiny_model_dir}", *rl]).cfg  # nothing to share: rows counted whole
    sao = estimate_run(one_sample, shape, 100, prompt_tokens=60)
    rows = min(64, one_sample.rollout.prompts_per_step + one_sample.rollout.oversample_groups)
    assert "64 rows x 100 tokens" in megatron.detail["train actor"]
    assert f"{rows} rows x 100 tokens" in sao.detail["train actor"] and rows > 1
    moe = estimate_run(tiny_cfg(tiny_model_dir, *rl), replace(shape, moe=True), 100, prompt_tokens=60)
    assert moe.parts["train actor"] == whole.parts["train actor"]


def test_data_parallel_ranks_each_count_and_fsdp2_shards_the_model_state(tiny_model_dir):
    shape = ModelShape.from_folder(str(tiny_model_dir))
    one = estimate_run(tiny_cfg(tiny_model_dir), shape, 100).parts["train actor"]
    ddp = estimate_run(tiny_cfg(tiny_model_dir, "train.dp_size=2"), shape, 100).parts["train actor"]
    fsdp = estimate_run(tiny_cfg(tiny_model_dir, "train.dp_size=2", "train.strategy=fsdp2"), shape, 100)
    assert ddp == 2 * one
    model_state = 4 * shape.parameters * 4  # fp32 weights, gradients, AdamW's two moments
    assert ddp - fsdp.parts["train actor"] == pytest.approx(model_state, rel=0.01)  # each rank keeps half


def test_megatron_counts_every_rank_and_splits_the_model_state_over_tp_and_pp(tiny_model_dir):
    shape = ModelShape.from_folder(str(tiny_model_dir))
    megatron = ("train.backend=megatron",)
    one = estimate_run(tiny_cfg(tiny_model_dir, *megatron), shape, 100).parts["train actor"]
    tp2 = estimate_run(tiny_cfg(tiny_model_dir, *megatron, "train.megatron.tp=2"), shape, 100)
    model_state = 4 * shape.parameters * 4
    assert tp2.parts["train actor"] == pytest.approx(2 * one - model_state, rel=0.01)  # 2 ranks, half each
    assert tp2.detail["train actor"].startswith("2 x ")
    grid = estimate_run(tiny_cfg(tiny_model_dir, *megatron, "train.dp_size=2", "train.megatron.tp=2",
                                 "train.megatron.pp=2"), shape, 100)
    assert grid.parts["train actor"] == pytest.approx(8 * one - 6 * model_state, rel=0.01)  # 8 ranks, a quarter each


def test_teacher_slots_count_their_weights_host_copies_and_prefetch_buffer(tiny_model_dir):
    """Two teachers resident in two slots hold one model each; sharing one slot holds one model,
    a host copy of each teacher and (prefetch) a spare buffer; the train actor adds the
    teachers' fp32 output layers and the batch's hidden states either way."""
    shape = ModelShape.from_folder(str(tiny_model_dir))
    teachers = [f"model.path={tiny_model_dir}", *(f"opd.teachers.{i}.path={tiny_model_dir}" for i in range(2))]

    def estimate(*overrides):  # the distillation step term's share (loongsage-distill's memory)
        run = load_config("tiny/mopd", [*teachers, *overrides])
        return run.cfg, estimate_run(run.cfg, shape, 100, step_terms=run.step_terms)

    cfg, shared = estimate()
    without = estimate_run(cfg, shape, 100)
    resident = estimate("opd.teacher_slots=0")[1]
    no_prefetch = estimate("opd.teacher_slots=1", "opd.prefetch=false")[1]
    weights = shape.parameters * 4
    assert "teacher slots" not in without.parts
    assert resident.parts["teacher slots"] - shared.parts["teacher slots"] == pytest.approx(
        PROCESS_BYTES + 3 * cfg.train.logprob_chunk_tokens * shape.vocab * 4 + 32 * 100 * shape.hidden * 4
        - 2 * weights)  # a second slot, against two host copies and a spare buffer in the one
    assert shared.parts["teacher slots"] - no_prefetch.parts["teacher slots"] == weights
    trainer = shared.parts["train actor"] - without.parts["train actor"]
    assert trainer == 2 * shape.vocab * shape.hidden * 4 + 32 * 100 * shape.hidden * 4
    assert "2 teacher(s) in 1 slot(s)" in shared.line()


def test_weights_count_once_where_the_trainer_and_engines_share_the_ring(tiny_model_dir):
    """Colocated CPU full fine-tuning: the engines read the ring, the trainer's weights are the
    ring, so neither the ring nor the engine counts them again; each exception counts its copy."""
    shape = ModelShape.from_folder(str(tiny_model_dir))
    weights = shape.parameters * 4

    def parts(*overrides):
        est = estimate_run(tiny_cfg(tiny_model_dir, *overrides), shape, 100)
        return est.parts["rollout engines"], est.parts["weight-sync ring"], est

    engines, ring, shared = parts()
    assert ring == 0 and "weight-sync ring 0.0 GB (the train ranks' weights)" in shared.line()
    # every copy its own
    assert parts("placement.mode=disaggregated", "async.enable=true")[:2] == (engines + weights, weights)
    # the trainer keeps a delta shadow, FSDP2 sends gathered shards: their rings are copies
    assert parts("transfer.delta=true")[:2] == (engines, weights)
    assert parts("train.dp_size=2", "train.strategy=fsdp2")[:2] == (engines, weights)
    assert parts("train.dp_size=2")[:2] == (engines, 0)  # each DDP rank's ring holds its own share
    # adapters travel, the base weights stay private
    assert parts("train.lora.rank=4")[:2] == (engines + weights, weights)


def test_an_engine_in_its_train_ranks_process_adds_no_process(tiny_model_dir):
    """The estimate takes the count from the decision that places the engines (``host_seats``:
    engine i shares rank i's process where the run and the engine class allow it)."""
    from loongsage.controller.build import host_seats
    from loongsage.controller.placement import plan_placement
    from loongsage.engines.embedded_rollout.engine import EmbeddedRolloutEngine
    from loongsage.engines.embedded_train import EmbeddedTrainEngine

    def hosted(*overrides, engine=EmbeddedRolloutEngine):
        plan = plan_placement(tiny_cfg(tiny_model_dir, *overrides), None)
        return len(host_seats(tiny_cfg(tiny_model_dir, *overrides), engine, plan.role("train"), plan.role("rollout")))

    assert hosted() == 1
    assert hosted("rollout.num_engines=2") == 1  # one train rank: only engine 0 shares its process
    assert hosted("train.dp_size=2", "rollout.num_engines=2") == 2
    assert hosted("placement.share_process=false") == 0
    assert hosted("placement.mode=disaggregated", "async.enable=true") == 0
    assert hosted(engine=EmbeddedTrainEngine) == 0  # a class that does not say it can share

    shape = ModelShape.from_folder(str(tiny_model_dir))
    cfg = tiny_cfg(tiny_model_dir)
    shared = estimate_run(cfg, shape, 100, engines_in_train_processes=1)
    own = estimate_run(cfg, shape, 100)
    assert own.parts["rollout engines"] - shared.parts["rollout engines"] == PROCESS_BYTES
    assert "1 in train ranks' processes" in shared.detail["rollout engines"]
