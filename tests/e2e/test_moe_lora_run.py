"""``tiny/grpo`` on ``builtin:tiny_moe`` with R3 router replay and LoRA, through the real CLI:
Ray actors, HTTP engines that return routes, TransferMesh sending adapters only.

Asserts every step trained under the rollout's routes (``train/routing_mismatch`` 0, with
routes on every trained token's row), that each sync carried the adapters' bytes and one
float64 scaling per module, that the engine's merged weights reproduce the trainer's
log-probs (k3 below 1e-6), and that the final model is the adapter.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_tiny_moe_r3_lora_run(tmp_path, runs):
    run_dir = tmp_path / "moe_lora"
    runs.train(run_dir, "model.path=builtin:tiny_moe", "trainer.router_replay=rollout", "train.lora.rank=8",
               "train.lora.alpha=16", "train.lr=1e-3", "trainer.steps=3", "trainer.sft.steps=0",
               "rollout.prompts_per_step=2", "rollout.n_samples_per_prompt=4")
    rows = runs.metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    final = run_dir / "final_model"
    config = json.loads((final / "adapter_config.json").read_text())
    assert config["r"] == 8 and not (final / "model.safetensors").exists()
    from safetensors import safe_open

    with safe_open(str(final / "adapter_model.safetensors"), "pt") as f:
        modules = sum(".lora_A." in k for k in f.keys())
        adapter_bytes = sum(f.get_tensor(k).numel() * 4 for k in f.keys())
    for row in rows:
        assert row["train/routing_mismatch"] == 0.0
        assert row["train/is_approx_k3_kl"] < 1e-6
        # + each module's float64 scaling, which takes one 64-byte aligned slot of a bucket
        assert adapter_bytes + 8 * modules <= row["perf/weight_sync_gb"] * 1e9 <= adapter_bytes + 64 * modules
