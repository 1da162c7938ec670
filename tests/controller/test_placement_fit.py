"""A placement that can never fit a local Ray cluster (which cannot grow) is refused at once.

Before, ``train.dp_size=2`` colocated on a 2-CPU local cluster waited ``placement.timeout_s``
(120 s) for resources that could never come, then gave its (clear) error. The real local Ray
of the test session (2 CPUs) is asked for plans built by ``plan_placement`` from the schema.
"""

from __future__ import annotations

import time

import pytest
from omegaconf import OmegaConf

from loongsage.config.store import root_schema
from loongsage.controller.placement import (GroupPlan, Placement, PlacementError, PlacementPlan, plan_placement,
                                            shortfall)


def plan(**overrides):
    cfg = OmegaConf.merge(root_schema(), OmegaConf.from_dotlist([f"{k}={v}" for k, v in overrides.items()]))
    return plan_placement(cfg, None)


def test_a_plan_larger_than_the_local_cluster_is_refused_at_once(ray_cluster):
    too_big = plan(**{"train.dp_size": 2, "rollout.num_engines": 1, "placement.train_cpus": 1,
                      "placement.rollout_cpus": 1})  # 2 bundles of 2 CPUs on 2 CPUs
    start = time.monotonic()
    with pytest.raises(PlacementError) as err:
        Placement.reserve(too_big, nodes=1, timeout_s=60, fixed=True)
    assert time.monotonic() - start < 10  # not the 60 s timeout
    message = str(err.value)
    assert message.startswith("placement.mode=colocated: this local Ray cluster (fixed size: ")
    assert "can never hold the run's bundles: 4 CPU asked for in all, 2 in the cluster." in message
    assert message.endswith("raise placement.num_cpus for a local cluster, or add nodes")
    assert ray_cluster.util.placement_group_table() == {} or all(
        t["state"] == "REMOVED" for t in ray_cluster.util.placement_group_table().values())


def test_a_plan_that_fits_is_placed(ray_cluster):
    fits = plan(**{"placement.train_cpus": 0.5, "placement.rollout_cpus": 0.5})
    placement = Placement.reserve(fits, nodes=1, timeout_s=60, fixed=True)
    try:
        assert set(placement.groups) == {"colocated"}
    finally:
        placement.remove()


def test_what_can_never_fit_is_named():
    node = {"CPU": 4.0, "memory": 1e9}
    strict = PlacementPlan("disaggregated", (GroupPlan("train", "STRICT_PACK", ({"CPU": 3.0},) * 2),), ())
    assert shortfall(strict, [node, node]) == ("group 'train': its bundles together (STRICT_PACK) "
                                               "{'CPU': 6.0} fits no node")
    assert shortfall(PlacementPlan("disaggregated", (GroupPlan("train", "PACK", ({"CPU": 3.0},) * 2),), ()),
                     [node, node]) is None  # one bundle per node
    custom = PlacementPlan("colocated", (GroupPlan("colocated", "PACK", ({"CPU": 1.0, "trainer_node": 1.0},)),), ())
    assert shortfall(custom, [node]) == "1 trainer_node asked for in all, 0 in the cluster"
    gpus = PlacementPlan("colocated", (GroupPlan("colocated", "PACK", ({"CPU": 1.0, "GPU": 1.0},) * 2),), ())
    assert shortfall(gpus, [{**node, "GPU": 1.0}]) == "2 GPU asked for in all, 1 in the cluster"
