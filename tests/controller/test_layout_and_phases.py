"""Placement for real: actors in the bundles the plan gave them, and colocated phase order.

A run is built in this process on a local Ray cluster (``build_run``: placement groups, real
train ranks joined by gloo, real rollout engines over HTTP, TransferMesh) and its
``layout.json`` is checked against Ray's own records: each actor's placement group and node
as the actor reports them, the node Ray placed its bundle on, and the CPUs booked in every
bundle. For the phase order, the engines are the embedded ones subclassed only to note when
each call happens (a config-local plugin module, as a user would write one): on CPU the
offload/onload moves are no-ops, so the test checks that the controller calls them at the
step's boundaries, in order. The same calls move real tensors on a GPU (benchmarks/gpu_check.py).
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

SPIES = '''
import time

from loongsage import hookimpl
from loongsage.engines.embedded_rollout.engine import EmbeddedRolloutEngine
from loongsage.engines.embedded_train import EmbeddedTrainEngine


class Noting:
    def note(self, event):
        self.__dict__.setdefault("notes", []).append((time.monotonic(), event))

    def events(self):
        return list(self.__dict__.get("notes", []))

    def offload(self):
        self.note("offload")
        return super().offload()

    def onload(self):
        self.note("onload")
        return super().onload()


class SpyTrain(Noting, EmbeddedTrainEngine):
    def train_step(self, *args, **kwargs):
        self.note("train_step")
        return super().train_step(*args, **kwargs)


class SpyRollout(Noting, EmbeddedRolloutEngine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        submit = self.scheduler.submit

        def noted(*requests):
            self.note("generate")
            return submit(*requests)

        self.scheduler.submit = noted

    def apply_weights(self, *args, **kwargs):
        self.note("apply_weights")
        return super().apply_weights(*args, **kwargs)

    def bind_weights(self, *args, **kwargs):
        self.note("bind_weights")
        return super().bind_weights(*args, **kwargs)


@hookimpl
def loongsage_register_engines(register):
    register("spy_train", SpyTrain)
    register("spy_rollout", SpyRollout)
'''

SMALL = ["rollout.prompts_per_step=2", "rollout.n_samples_per_prompt=2", "rollout.max_new_tokens=4",
         "trainer.steps=1", "trainer.sft.steps=0", "checkpoint.interval=0",
         "logging.progress_bar=false", "logging.trackers=[]", "placement.train_cpus=0.5",
         "placement.rollout_cpus=0.5", "train.num_threads=1", "rollout.num_threads=1"]


@pytest.fixture
def spec_for(tmp_path, monkeypatch):
    from ray import cloudpickle

    from loongsage.config.compose import load_config
    from loongsage.plugins import clear_cache

    (tmp_path / "spy_engines.py").write_text(textwrap.dedent(SPIES))
    (tmp_path / "spy.yaml").write_text("defaults:\n  - /tiny/grpo\n  - _self_\nplugins: [spy_engines]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    sys.modules.pop("spy_engines", None)
    started = not ray.is_initialized()

    def make(run_dir, *overrides):
        spec = load_config("spy", [*SMALL, f"trainer.run_dir={run_dir}", "train.backend=spy_train",
                                   "rollout.backend=spy_rollout", *overrides], str(tmp_path))
        cloudpickle.register_pickle_by_value(sys.modules["spy_engines"])
        return spec

    yield make
    clear_cache()
    if started and ray.is_initialized():
        ray.shutdown()


def booked(group_id: str, bundle: int) -> float:
    """CPUs Ray counts as taken in one bundle of a placement group."""
    key = f"CPU_group_{bundle}_{group_id}"
    return ray.cluster_resources()[key] - ray.available_resources().get(key, 0.0)


def test_colocated_ranks_and_engines_share_bundles_and_take_turns(spec_for, tmp_path):
    from loongsage.controller.build import build_run
    from loongsage.controller.lifecycle import resume_or_warm_start
    from loongsage.controller.run import train_one_step

    spec = spec_for(tmp_path / "run", "train.dp_size=2", "rollout.num_engines=2")
    with build_run(spec) as run:
        layout = json.loads((tmp_path / "run" / "layout.json").read_text())
        assert layout["mode"] == "colocated"
        rows = {(a["role"], a["rank"]): a for a in layout["actors"]}
        assert sorted(rows) == [("rollout", 0), ("rollout", 1), ("train", 0), ("train", 1)]
        for i in range(2):
            train, engine = rows[("train", i)], rows[("rollout", i)]
            assert train["bundle"] == engine["bundle"] == i
            assert train["placement_group_id"] == engine["placement_group_id"]
            assert train["node_id"] == engine["node_id"] and train["device"] == "cpu"
            assert booked(train["placement_group_id"], i) == pytest.approx(1.0)  # 0.5 + 0.5
            assert train["pid"] == engine["pid"]  # placement.share_process: engine i in rank i's process
        assert run.trainers.backend == "gloo"

        resume_or_warm_start(run)
        run.phases.to_rollout()
        metrics = train_one_step(run, 0)
        notes = []
        for role, actors in (("train", run.trainers.actors), ("rollout", run.rollout_actors)):
            for actor in actors:
                notes += [(t, f"{role}.{event}") for t, event in ray.get(actor.call.remote("events"))]
    notes.sort()
    order = [event for _, event in notes]
    first_offload = order.index("train.offload")
    step = order[first_offload + 2:]  # both ranks offloaded before the first rollout
    assert order[:first_offload + 2] == ["train.offload"] * 2
    # colocated CPU engines keep the weight-sync ring's views as their weights: bound, not copied
    phases = ["rollout.generate", "rollout.offload", "train.onload", "train.train_step",
              "rollout.onload", "rollout.bind_weights", "train.offload"]
    collapsed = [e for i, e in enumerate(step) if i == 0 or e != step[i - 1]]
    assert collapsed == phases, order
    assert step.count("train.train_step") == 2 and step.count("rollout.bind_weights") == 2
    assert metrics["rollout/engine_requests/0"] > 0 and metrics["rollout/engine_requests/1"] > 0
    assert metrics["perf/weight_sync_senders"] == 2


def test_disaggregated_roles_get_groups_of_their_own_and_pinned_cores(spec_for, tmp_path):
    from loongsage.controller.build import build_run

    spec = spec_for(tmp_path / "run", "placement.mode=disaggregated", "async.enable=true",
                    "train.dp_size=2", "rollout.num_engines=2")
    with build_run(spec):
        layout = json.loads((tmp_path / "run" / "layout.json").read_text())
    assert layout["mode"] == "disaggregated"
    rows = {(a["role"], a["rank"]): a for a in layout["actors"]}
    groups = {role: {rows[(role, i)]["placement_group_id"] for i in range(2)} for role in ("train", "rollout")}
    assert len(groups["train"]) == len(groups["rollout"]) == 1 and groups["train"] != groups["rollout"]
    assert [rows[("train", i)]["bundle"] for i in range(2)] == [0, 1]
    assert [rows[("rollout", i)]["bundle"] for i in range(2)] == [0, 1]
    cores = [rows[key]["cores"] for key in (("train", 0), ("train", 1), ("rollout", 0), ("rollout", 1))]
    assert all(a["pinned"] and len(a["cores"]) == 1 and a["torch_threads"] == 1 for a in rows.values())
    assert len({a["pid"] for a in rows.values()}) == 4  # every actor a process of its own
    import os

    available = sorted(os.sched_getaffinity(0))
    assert cores == [[available[i % len(available)]] for i in range(4)]  # disjoint while cores last
