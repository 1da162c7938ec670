"""Placement plans from the validated config: bundles, seats, pinning; the config checks
that refuse shapes that cannot split or layouts that do not fit the declared GPUs."""

from __future__ import annotations

import pytest

from loongsage.config.compose import load_config
from loongsage.controller.placement import plan_placement
from loongsage.engines.mesh_sync import owners_by_size
from loongsage.errors import ConfigError


def cfg(*overrides: str):
    return load_config("tiny/grpo", list(overrides)).cfg


def seats(plan, role):
    return [(s.group, s.bundle, s.num_cpus, s.num_gpus) for s in plan.role(role)]


def test_colocated_bundle_i_holds_train_rank_i_and_engine_i():
    plan = plan_placement(cfg("train.dp_size=2", "rollout.num_engines=3", "placement.train_cpus=0.5",
                              "placement.rollout_cpus=0.5", "+placement.train_resources.node_a=1",
                              "rollout.prompts_per_step=8"), cores=None)
    (group,) = plan.groups
    assert group.name == "colocated" and group.strategy == "PACK"
    assert list(group.bundles) == [{"CPU": 1.0, "node_a": 1.0}] * 3
    assert seats(plan, "train") == [("colocated", 0, 0.5, 0.0), ("colocated", 1, 0.5, 0.0)]
    assert seats(plan, "rollout") == [("colocated", i, 0.5, 0.0) for i in range(3)]
    assert {s.threads for s in plan.seats} == {1} and all(s.cores is None for s in plan.seats)


def test_megatron_seats_every_tensor_and_pipeline_rank_of_every_replica():
    """dp_size=2 replicas of tp=2 x pp=1: four train seats, one bundle each (two shared with
    the engines); the mixer's shards still follow dp_size."""
    plan = plan_placement(cfg("train.backend=megatron", "train.dp_size=2", "train.megatron.tp=2",
                              "rollout.num_engines=2", "placement.train_cpus=0.5",
                              "placement.rollout_cpus=0.5"), cores=None)
    assert seats(plan, "train") == [("colocated", i, 0.5, 0.0) for i in range(4)]
    assert len(plan.groups[0].bundles) == 4
    disaggregated = plan_placement(cfg("train.backend=megatron", "train.megatron.pp=2",
                                       "placement.mode=disaggregated", "async.enable=true"), cores=None)
    assert [s.bundle for s in disaggregated.role("train")] == [0, 1]


def test_colocated_gpu_bundles_share_one_gpu_between_the_two_roles():
    plan = plan_placement(cfg("train.dp_size=2", "rollout.num_engines=2", "placement.gpus_per_node=2"),
                          cores=None)
    assert list(plan.groups[0].bundles) == [{"CPU": 2.0, "GPU": 1.0}] * 2
    assert {s.num_gpus for s in plan.seats} == {0.5}


def test_disaggregated_groups_per_role_with_their_own_strategy_resources_and_cores():
    c = cfg("placement.mode=disaggregated", "async.enable=true", "train.dp_size=2",
            "rollout.num_engines=2", "placement.rollout_strategy=SPREAD",
            "+placement.rollout_resources.node_b=0.5", "placement.gpus_per_node=4")
    plan = plan_placement(c, cores=[0, 1, 2, 3])
    groups = {g.name: g for g in plan.groups}
    assert groups["train"].strategy == "PACK" and groups["rollout"].strategy == "SPREAD"
    assert list(groups["train"].bundles) == [{"CPU": 1.0, "GPU": 1.0}] * 2
    assert list(groups["rollout"].bundles) == [{"CPU": 1.0, "node_b": 0.5, "GPU": 1.0}] * 2
    assert seats(plan, "train") == [("train", 0, 1.0, 1.0), ("train", 1, 1.0, 1.0)]
    assert [s.cores for s in plan.seats] == [(0,), (1,), (2,), (3,)]  # trainers first, disjoint
    assert {s.threads for s in plan.seats} == {1}
    remote = plan_placement(c, cores=None)
    assert all(s.cores is None for s in remote.seats)


@pytest.mark.parametrize("overrides, key, message", [
    (["train.dp_size=3"], "rollout.prompts_per_step",
     r"8 prompt groups cannot be cut into train.mini_batches_per_step=1 x train.dp_size=3"),
    (["train.dp_size=2", "train.mini_batches_per_step=3"], "rollout.prompts_per_step",
     r"use a multiple of 6"),
    (["train.dp_size=2", "rollout.prompts_per_step=4", "trainer.sft.batch_size=5"],
     "trainer.sft.batch_size", r"5 examples cannot be split evenly over train.dp_size=2"),
    (["trainer.sft.lr_decay=cosin"], "trainer.sft.lr_decay", r"expected one of \['constant', 'cosine', 'linear'\]"),
    (["trainer.sft.steps=5", "trainer.sft.warmup_steps=6"], "trainer.sft.warmup_steps",
     r"must be in \[0, trainer.sft.steps=5\], got 6"),
    (["placement.gpus_per_node=2", "train.dp_size=2", "rollout.num_engines=3"],
     "placement.gpus_per_node", r"max\(train.dp_size, rollout.num_engines\) = 3 GPUs"),
    (["placement.mode=disaggregated", "async.enable=true", "placement.gpus_per_node=1",
      "placement.nodes=1"], "placement.gpus_per_node", r"train.dp_size \+ rollout.num_engines = 2"),
    (["train.strategy=zero3"], "train.strategy", r"expected one of ddp, fsdp2"),
    (["placement.rollout_strategy=PACKED"], "placement.rollout_strategy", r"did you mean 'PACK'"),
    (["train.dp_size=0"], "train.dp_size", r">= 1"),
])
def test_shapes_that_cannot_split_or_fit_are_refused_naming_the_keys(overrides, key, message):
    with pytest.raises(ConfigError, match=message) as err:
        cfg(*overrides)
    assert err.value.key == key


def test_two_nodes_of_gpus_fit_a_disaggregated_layout():
    c = cfg("placement.mode=disaggregated", "async.enable=true", "placement.gpus_per_node=2",
            "placement.nodes=2", "train.dp_size=2", "rollout.num_engines=2")
    assert c.placement.nodes == 2


def test_weight_ownership_is_disjoint_complete_and_balanced_by_size():
    sizes = [("embed", 100), ("a", 40), ("b", 40), ("c", 10), ("d", 10), ("e", 5)]
    owners = owners_by_size(sizes, 2)
    assert set(owners) == {name for name, _ in sizes}
    load = [sum(size for name, size in sizes if owners[name] == r) for r in range(2)]
    assert load == [105, 100]  # the largest alone on rank 0, the rest filled onto rank 1 first
    assert owners_by_size(sizes, 1) == dict.fromkeys(owners, 0)
