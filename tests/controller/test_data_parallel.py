"""Data-parallel train ranks give the single-process update: DDP and FSDP2 over gloo.

Real Ray actors (``EngineHost`` with the embedded train engine and the tiny model), a real
``torch.distributed`` group joined through rank 0's TCP store, and the controller's own path
(``plan_shards`` -> ``groups_to_batch`` -> ``TrainGroup.train`` -> ``TrainStep``).
The same GRPO step (two mini-batches, micro-batches of 3 rows) runs with ``dp_size`` 1, and 2
with each strategy; the updated weights must agree within 1e-6.

AdamW's first step divides by the gradient's own magnitude and clipping rescales it, either
of which would hide a wrongly scaled gradient (docs/backends.md), so ``train.eps`` is 1.0 and
clipping is off: the update is then about ``lr * gradient``, and a gradient off by any
factor, or missing a rank's rows, moves the weights by far more than the bound. The reported
loss and gradient norm (global on every rank) must also match.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
import torch

from loongsage.algorithms.objective import Objective
from loongsage.controller.actors import EngineHost
from loongsage.controller.batching import groups_to_batch, plan_shards
from loongsage.controller.train_group import TrainGroup
from loongsage.controller.train_step import TrainStep
from loongsage.data.types import Group
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.plugins import get_registries

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

SOURCES = ["math", "code"]


@pytest.fixture
def make_groups(random_groups):
    """Two sources, some first tokens untrained, out of order (as the async scheduler delivers)."""
    return lambda count, seed=0: random_groups(count, seed, sources=tuple(SOURCES), untrained_first=True,
                                               shuffle=True)


@contextmanager
def ranks(model_dir, dp_size: int, strategy: str):
    """``dp_size`` train actors joined as one ``TrainGroup`` (killed on exit)."""
    cfg = {"model": {"path": str(model_dir)},
           "train": {"lr": 0.1, "eps": 1.0, "micro_batch_size": 3, "grad_clip": 0.0,
                     "num_threads": 1},
           "trainer": {"seed": 0}}
    host = ray.remote(EngineHost).options(num_cpus=0.5)
    actors = [host.remote(EmbeddedTrainEngine, cfg, 1) for _ in range(dp_size)]
    try:
        group = TrainGroup(actors)
        group.connect("127.0.0.1", strategy)
        yield group
    finally:
        for actor in actors:
            ray.kill(actor)


def step(group: TrainGroup, groups: list[Group], minis: int = 2):
    """One GRPO step on ``groups``: (metrics, the shards)."""
    ordered, shards = plan_shards(groups, SOURCES, minis, group.world_size, offset=0)
    batch, rewards, group_index = groups_to_batch(ordered, pad_id=0)
    objective = Objective.from_config({}, get_registries())
    metrics, _ = group.train(batch, rewards, group_index, shards, TrainStep(objective))
    return metrics, shards


def train_once(model_dir, groups, dp_size: int, strategy: str):
    """One step from the initial weights: (metrics, full state dict after it, the shards)."""
    with ranks(model_dir, dp_size, strategy) as group:
        metrics, shards = step(group, groups)
        return metrics, group.run(_full_state)[0], shards


def _full_state(engine) -> dict[str, np.ndarray]:
    named = engine.parallel.full_tensors(engine.named_tensors(), lambda name: True)
    return {name: tensor.detach().cpu().numpy().copy() for name, tensor in named}


def _max_diff(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def test_two_ranks_update_the_weights_like_one(ray_cluster, tiny_model_dir, make_groups):
    """7 groups, 2 mini-batches: the first splits evenly (2 + 2 groups), the second leaves
    one rank a group short, padded with masked rows."""
    groups = make_groups(7)
    base_metrics, base, _ = train_once(tiny_model_dir, groups, 1, "ddp")
    from safetensors.torch import load_file

    start = load_file(str(tiny_model_dir / "model.safetensors"))
    moved = max(float((torch.tensor(base[k]) - start[k]).abs().max()) for k in start)
    assert moved > 1e-4, "the step must move the weights well beyond the tolerance"
    real_tokens = sum(sum(s.loss_mask) for g in groups for s in g.samples)
    assert base_metrics["train/optimizer_steps"] == 2
    for strategy in ("ddp", "fsdp2"):
        metrics, state, shards = train_once(tiny_model_dir, groups, 2, strategy)
        assert shards.world_size == 2 and bool(shards.pad[0].any()) != bool(shards.pad[1].any())
        assert _max_diff(state, base) < 1e-6, strategy
        for key in ("train/loss", "train/pg_loss", "train/grad_norm", "train/is_approx_k3_kl"):
            assert metrics[key] == pytest.approx(base_metrics[key], rel=1e-5, abs=1e-9), (strategy, key)
        # token counts are global and leave the padding rows out
        assert metrics["train/num_tokens"] == base_metrics["train/num_tokens"]
        assert 2 * base_metrics["train/num_tokens"] == pytest.approx(real_tokens, abs=1)


def test_fsdp2_checkpoint_resumes_exactly_and_loads_into_another_dp_size(ray_cluster, tiny_model_dir,
                                                                          tmp_path, make_groups):
    """Same dp_size: the shards restore weights and AdamW moments, so the next step is the
    uninterrupted one. Another dp_size: the HF export restores the weights, moments restart."""
    first, second = make_groups(8, seed=1), make_groups(8, seed=2)
    folder = str(tmp_path / "ckpt")
    with ranks(tiny_model_dir, 2, "fsdp2") as group:
        step(group, first)
        after_first = group.run(_full_state)[0]
        group.call("save", folder)
        step(group, second)
        uninterrupted = group.run(_full_state)[0]
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()
    shards = sorted((tmp_path / "ckpt" / "sharded").glob("*.distcp"))
    assert len(shards) == 2 and (tmp_path / "ckpt" / "sharded" / "meta.json").is_file()
    with ranks(tiny_model_dir, 2, "fsdp2") as group:
        group.call("load", folder)
        assert group.run(_restored) == [(2, True)] * 2  # two optimizer steps, moments loaded
        step(group, second)
        assert _max_diff(group.run(_full_state)[0], uninterrupted) < 1e-6
    with ranks(tiny_model_dir, 1, "ddp") as group:
        group.call("load", folder)
        assert group.run(_restored) == [(2, False)]  # the weights, not the moments
        assert _max_diff(group.run(_full_state)[0], after_first) == 0.0
        step(group, second)
        fresh_moments = group.run(_full_state)[0]
    assert _max_diff(fresh_moments, uninterrupted) > 1e-4  # what restarting the moments costs


def _restored(engine) -> tuple[int, bool]:
    """The weight version and whether the optimizer holds moments."""
    return engine.weight_version, bool(engine.optimizer.state)


def distill_objective(model_dir) -> Objective:
    """Mixed on-policy distillation (docs/distillation.md): λ_gkd = 0.5 with ``full_kl`` as both
    the GKD loss and the PG penalty (λ_pg = 0.5), the teacher's logits rebuilt from hidden
    states with the tiny model's own LM head in every rank."""
    from loongsage_distill.train_term import OPDTerm

    registries = get_registries()
    method = registries.resolve("kl_policy", "full_kl", "opd.gkd_kl_method")
    term = OPDTerm(pg_ratio=0.5, gkd_ratio=0.5, pg_method=method, gkd_method=method, beta=0.5, topk=4,
                   head_paths=(str(model_dir),), fp32=True, source_names=tuple(SOURCES),
                   loss_agg_mode="token_mean", loss_agg_norm_len=None)
    return Objective(Objective.from_config({}, registries).spec, term)


def with_teacher(batch, ordered: list[Group]):
    """Teacher outputs as the distiller writes them: hidden states [N, L, H] (random, so the
    divergence is far from 0), the teacher's entropy, one teacher, each row's source."""
    from loongsage_distill.train_term import ENTROPY, HIDDEN, SOURCE, TEACHER

    g = torch.Generator().manual_seed(3)
    n, length = batch.input_ids.shape
    batch.extras[HIDDEN] = torch.randn(n, length, 256, generator=g)  # the tiny model's hidden size
    batch.extras[ENTROPY] = torch.rand(n, length, generator=g)
    batch.extras[TEACHER] = torch.zeros(n, dtype=torch.long)
    batch.extras[SOURCE] = torch.tensor([SOURCES.index(grp.prompt.source) for grp in ordered for _ in grp.samples])
    return batch


def test_two_ranks_distill_like_one(ray_cluster, tiny_model_dir, make_groups):
    """On-policy distillation through the same path: the π_old forward's logit values are
    gathered over the shards before the PG penalty, the GKD loss runs in each rank's LM head,
    and the per-source means are taken after the ranks' sums are added."""
    groups = make_groups(7)
    objective = distill_objective(tiny_model_dir)
    results = {}
    for dp_size in (1, 2):
        with ranks(tiny_model_dir, dp_size, "ddp") as group:
            ordered, shards = plan_shards(groups, SOURCES, 2, dp_size, offset=0)
            batch, rewards, group_index = groups_to_batch(ordered, pad_id=0)
            metrics, kept = group.train(with_teacher(batch, ordered), rewards, group_index, shards,
                                        TrainStep(objective), keep_rows=[0])
            results[dp_size] = metrics, group.run(_full_state)[0]
    (one, base), (two, state) = results[1], results[2]
    assert _max_diff(state, base) < 1e-6
    assert one["opd/kl"] > 0.1 and one["opd/pg_kl"] > 0.1 and 0 < one["opd/kl/math"] != one["opd/kl/code"]
    for key in ("train/loss", "opd/loss", "opd/kl", "opd/kl/math", "opd/kl/code", "opd/pg_kl", "opd/pg_kl/code",
                "opd/topk_overlap", "opd/entropy_gap"):
        assert two[key] == pytest.approx(one[key], rel=1e-5), key
    assert not any(key.startswith(("opd_sum/", "opd_tokens/")) for key in two)
