"""The tiny GRPO recipe with ``train.backend=megatron`` end to end, across a kill and a resume.

Real processes throughout (the CLI in a subprocess with its own Ray cluster, Megatron-Core
on CPU with gloo, real HTTP rollout engine, TransferMesh). The run trains on two
tensor-parallel ranks (``train.megatron.tp=2``: vocab-parallel LM head, both ranks sending
weights). It is killed with SIGKILL (process group, Ray included) right after its first
checkpoint and resumed with ``trainer.resume=true`` from its Megatron distributed checkpoint
(model shards + each rank's AdamW state). Every step, resumed ones included, training and
inference must agree token for token (k3 mismatch below 1e-6: the engine samples from the
weights both TP ranks sent), a resumed step must have a gradient, and the exported model must
differ from the one it started from (the recipe's warm start runs on Megatron too).

That Megatron *learns* is shown by a chain of exact checks rather than by a second 20-step
reward curve: one Megatron train step moves the weights as the embedded engine's does within
1e-5 at tp=1, tp=2, pp=2 and dp=2 (``tests/engines/megatron``), the embedded engine's run
learns (``test_tiny_learns.py``), and this run samples from the weights it trained. The
20-step version of this test took 7-8 minutes of a CI run; its reward rise (0.09 to 0.25 in
three runs against a 0.05 bar) was the weakest of those checks. The in-process exactness of a
resume (weights and moments bit for bit) is ``test_megatron_convert.py``'s.
"""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.slow

STEPS = 6
RUN = ("train.backend=megatron", "train.megatron.tp=2", "placement.train_cpus=0.5",
       "placement.rollout_cpus=0.5", f"trainer.steps={STEPS}", "checkpoint.interval=2",
       "rollout.max_new_tokens=24")


def test_tiny_grpo_trains_with_megatron_tp2_across_a_kill(tmp_path, runs):
    from loongsage.models.resolve import resolve_model_path
    from safetensors.torch import load_file

    run_dir = tmp_path / "tiny"
    last = runs.kill_after_a_checkpoint(run_dir, STEPS, *RUN)
    checkpoint = run_dir / "checkpoints" / f"step_{last:06d}" / "trainer"
    assert (checkpoint / "megatron" / "layout.json").is_file()
    assert {p.name for p in (checkpoint / "megatron_optimizer").iterdir()} == {"rank_0.pt", "rank_1.pt"}

    resumed = runs.train(run_dir, *RUN, "trainer.resume=true")
    assert f"continuing at step {last + 1}" in resumed.stdout
    rows = runs.metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(STEPS))
    for row in rows:
        assert row["train/is_approx_k3_kl"] < 1e-6, row
        assert row["perf/weight_sync_senders"] == 2
    # the recipe's warm start makes some groups' rewards differ: RL steps move the weights too
    assert any(row["train/grad_norm"] > 0 for row in rows[last + 1:]), "no resumed step had a gradient"
    start = load_file(resolve_model_path("builtin:tiny") / "model.safetensors")
    final = load_file(run_dir / "final_model" / "model.safetensors")
    assert start.keys() == final.keys()
    moved = max((final[k] - start[k]).abs().max().item() for k in start)
    assert moved > 1e-4, f"the exported model is the initial one (largest change {moved:.2e})"
