"""Placement: the Ray placement groups a run reserves, which bundle each actor sits in, and
the layout the actors report back (printed at start, saved as the run's ``layout.json``).

Two modes (``PLANS``), from ``placement.*``, the train ranks (``train_ranks``: ``train.dp_size``,
x ``train.megatron.tp x pp`` for the megatron backend) and ``rollout.num_engines``:

* **colocated**: one group of ``max(dp_size, num_engines)`` bundles; bundle i holds train
  rank i and rollout engine i, which take turns on it (each books its CPUs and half the
  bundle's GPU; between phases they offload, ``controller.phases``). Its strategy is
  ``placement.train_strategy``.
* **disaggregated**: a group per role, one bundle per actor, each with its own strategy.

A bundle is ``{"CPU": ..., "GPU": 1}`` (no GPU when ``placement.gpus_per_node`` is 0) plus
the role's ``placement.*_resources`` (custom node resources, e.g. to keep a role on one kind
of node). On a local cluster a disaggregated run also pins every actor to cores of its own
(``split_cores``): Ray books CPUs but does not keep threads apart.

An actor runs ``where()`` (``actors.EngineHost``) to say where it landed: node, GPU ids,
device, cores; ``layout`` joins that with the seat it was given and checks that the node
is the one Ray placed its bundle on.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Sequence

from loongsage.errors import LoongSageError


class PlacementError(LoongSageError):
    """The cluster cannot hold the bundles a run asks for (or an actor landed elsewhere)."""


@dataclass(frozen=True)
class Seat:
    """Where one actor goes: a bundle of a placement group, and what it books there."""

    role: str  # "train" | "rollout"
    rank: int
    group: str  # placement group name within the run
    bundle: int
    num_cpus: float
    num_gpus: float
    threads: int  # torch threads (train.num_threads / rollout.num_threads, else the cores it has)
    cores: tuple[int, ...] | None = None  # pinned cores (disaggregated, local cluster)


@dataclass(frozen=True)
class GroupPlan:
    name: str
    strategy: str
    bundles: tuple[dict, ...]


@dataclass(frozen=True)
class PlacementPlan:
    mode: str
    groups: tuple[GroupPlan, ...]
    seats: tuple[Seat, ...]

    def role(self, role: str) -> list[Seat]:
        return sorted((s for s in self.seats if s.role == role), key=lambda s: s.rank)


def _bundle(cpus: float, gpus: int, resources: dict) -> dict:
    bundle = {"CPU": float(cpus), **{k: float(v) for k, v in resources.items()}}
    if gpus:
        bundle["GPU"] = float(gpus)
    return bundle


def _threads(configured: int, cpus: float) -> int:
    return configured or max(1, math.ceil(cpus))


def train_ranks(train: Any) -> int:
    """Train actors a run starts: ``dp_size`` replicas of ``megatron.tp x megatron.pp`` ranks
    (1 x 1 for every backend but megatron, which config validation enforces)."""
    return train.dp_size * train.megatron.tp * train.megatron.pp


def colocated_plan(cfg: Any) -> PlacementPlan:
    p, dp, engines = cfg.placement, train_ranks(cfg.train), cfg.rollout.num_engines
    gpu = 1 if p.gpus_per_node else 0
    resources = dict(p.train_resources)
    for key, value in p.rollout_resources.items():
        resources[key] = resources.get(key, 0.0) + value
    cpus = p.train_cpus + p.rollout_cpus  # the phases take turns on every core of the bundle
    bundles = tuple(_bundle(cpus, gpu, resources) for _ in range(max(dp, engines)))
    share = 0.5 * gpu
    seats = [Seat("train", i, "colocated", i, p.train_cpus, share,
                  _threads(cfg.train.num_threads, cpus)) for i in range(dp)]
    seats += [Seat("rollout", i, "colocated", i, p.rollout_cpus, share,
                   _threads(cfg.rollout.num_threads, cpus)) for i in range(engines)]
    group = GroupPlan("colocated", p.train_strategy, bundles)
    return PlacementPlan("colocated", (group,), tuple(seats))


def disaggregated_plan(cfg: Any) -> PlacementPlan:
    p, gpu = cfg.placement, 1 if cfg.placement.gpus_per_node else 0
    groups, seats = [], []
    roles = (("train", train_ranks(cfg.train), p.train_cpus, p.train_strategy, p.train_resources,
              cfg.train.num_threads),
             ("rollout", cfg.rollout.num_engines, p.rollout_cpus, p.rollout_strategy,
              p.rollout_resources, cfg.rollout.num_threads))
    for role, count, cpus, strategy, resources, threads in roles:
        bundles = tuple(_bundle(cpus, gpu, resources) for _ in range(count))
        groups.append(GroupPlan(role, strategy, bundles))
        seats += [Seat(role, i, role, i, cpus, float(gpu), _threads(threads, cpus))
                  for i in range(count)]
    return PlacementPlan("disaggregated", tuple(groups), tuple(seats))


PLANS: dict[str, Callable[[Any], PlacementPlan]] = {
    "colocated": colocated_plan,
    "disaggregated": disaggregated_plan,
}


def split_cores(available: Sequence[int], shares: Sequence[float]) -> list[list[int]]:
    """Disjoint core sets, one per share (``ceil`` of each, at least one), in order.

    When the machine has fewer cores than asked for, the sets wrap around and overlap
    (Ray booked the CPUs, so this only happens with ``placement.num_cpus`` above the real count).
    """
    cores = sorted(available)
    if not cores:
        raise ValueError("split_cores: no CPU cores available")
    sets, start = [], 0
    for share in shares:
        count = max(1, math.ceil(share))
        sets.append([cores[(start + i) % len(cores)] for i in range(count)])
        start += count
    return sets


def pin_seats(plan: PlacementPlan, available: Sequence[int],
              threads: dict[str, int]) -> PlacementPlan:
    """Give every seat cores of its own, trainers first; threads follow the cores unless set."""
    ordered = plan.role("train") + plan.role("rollout")
    sets = split_cores(available, [s.num_cpus for s in ordered])
    return PlacementPlan(plan.mode, plan.groups, tuple(
        replace(seat, threads=threads[seat.role] or len(cores), cores=tuple(cores))
        for seat, cores in zip(ordered, sets)))


def plan_placement(cfg: Any, cores: Sequence[int] | None) -> PlacementPlan:
    """The run's plan; ``cores``: this machine's cores when a local disaggregated run pins."""
    plan = PLANS[cfg.placement.mode](cfg)
    if cores is None or plan.mode != "disaggregated":
        return plan
    threads = {"train": cfg.train.num_threads, "rollout": cfg.rollout.num_threads}
    return pin_seats(plan, cores, threads)


FIT_ADVICE = ("Lower train.dp_size / rollout.num_engines / placement.train_cpus / placement.rollout_cpus, "
              "raise placement.num_cpus for a local cluster, or add nodes")


def shortfall(plan: PlacementPlan, nodes: Sequence[dict]) -> str | None:
    """Why the bundles of every group of ``plan``, all held at once, can never fit ``nodes``
    (each node's total resources), or ``None`` when they may: a resource short in all, or a
    bundle (a STRICT_PACK group: its bundles together) larger than every node."""
    need = _summed([bundle for group in plan.groups for bundle in group.bundles])
    for key, amount in sorted(need.items()):
        have = sum(node.get(key, 0.0) for node in nodes)
        if amount > have + 1e-9:
            return f"{amount:g} {key} asked for in all, {have:g} in the cluster"
    for group in plan.groups:
        units = [_summed(group.bundles)] if group.strategy == "STRICT_PACK" else list(group.bundles)
        for unit in units:
            if not any(all(node.get(k, 0.0) + 1e-9 >= v for k, v in unit.items()) for node in nodes):
                what = "its bundles together (STRICT_PACK)" if group.strategy == "STRICT_PACK" else "a bundle"
                return f"group {group.name!r}: {what} {unit} fits no node"
    return None


def _summed(bundles: Sequence[dict]) -> dict:
    total: dict[str, float] = {}
    for bundle in bundles:
        for key, amount in bundle.items():
            total[key] = total.get(key, 0.0) + amount
    return total


@dataclass
class Placement:
    """The live placement groups of a plan (``reserve``), and the Ray options of each seat."""

    plan: PlacementPlan
    groups: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def reserve(cls, plan: PlacementPlan, nodes: int, timeout_s: float, fixed: bool = False) -> "Placement":
        """Wait for ``nodes`` live nodes, create every group and wait until it is placed.

        ``fixed``: the cluster cannot grow (a local one this run started), so a plan that
        does not fit its total resources is refused at once instead of after ``timeout_s``."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        deadline = time.monotonic() + timeout_s
        while sum(n["Alive"] for n in ray.nodes()) < nodes:
            if time.monotonic() > deadline:
                alive = sum(n["Alive"] for n in ray.nodes())
                raise PlacementError(f"placement.nodes={nodes}: only {alive} live Ray nodes "
                                     f"after placement.timeout_s={timeout_s}")
            time.sleep(0.5)
        if fixed:
            alive = [n["Resources"] for n in ray.nodes() if n["Alive"]]
            problem = shortfall(plan, alive)
            if problem is not None:
                raise PlacementError(
                    f"placement.mode={plan.mode}: this local Ray cluster (fixed size: "
                    f"{ray.cluster_resources()}) can never hold the run's bundles: {problem}. "
                    f"{FIT_ADVICE}")
        placement = cls(plan)
        for group in plan.groups:
            placement.groups[group.name] = placement_group(
                list(group.bundles), strategy=group.strategy)
        for group in plan.groups:
            pg = placement.groups[group.name]
            ready, _ = ray.wait([pg.ready()], timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                for created in placement.groups.values():
                    remove_placement_group(created)
                raise PlacementError(
                    f"placement.mode={plan.mode}: the cluster did not fit group {group.name!r} "
                    f"({len(group.bundles)} x {group.bundles[0]}, {group.strategy}) within "
                    f"placement.timeout_s={timeout_s}; cluster resources "
                    f"{ray.cluster_resources()}. {FIT_ADVICE}")
        return placement

    def options(self, seat: Seat) -> dict[str, Any]:
        """``ray.remote(...).options(**options)`` that put an actor into its seat's bundle."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(
            self.groups[seat.group], placement_group_bundle_index=seat.bundle,
            placement_group_capture_child_tasks=False)
        return {"num_cpus": seat.num_cpus, "num_gpus": seat.num_gpus,
                "scheduling_strategy": strategy}

    def bundle_nodes(self) -> dict[str, dict[int, str]]:
        """Per group: the node id Ray placed each bundle on."""
        from ray.util.placement_group import placement_group_table

        tables = {name: placement_group_table(pg) for name, pg in self.groups.items()}
        return {name: {int(k): v for k, v in table["bundles_to_node_id"].items()}
                for name, table in tables.items()}

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pg in self.groups.values():
            remove_placement_group(pg)
        self.groups.clear()


def layout(placement: Placement, seats: Sequence[Seat], reports: Sequence[dict]) -> list[dict]:
    """One row per actor: its seat and where it reports it runs (``EngineHost.where``).

    Refuses an actor outside its placement group or on another node than its bundle.
    """
    nodes = placement.bundle_nodes()
    rows = []
    for seat, report in zip(seats, reports):
        expected_group = placement.groups[seat.group].id.hex()
        expected_node = nodes[seat.group].get(seat.bundle)
        if report["placement_group_id"] != expected_group or expected_node != report["node_id"]:
            raise PlacementError(
                f"{seat.role} {seat.rank} runs in placement group {report['placement_group_id']} "
                f"on node {report['node_id']}, but its seat is bundle {seat.bundle} of group "
                f"{seat.group!r} ({expected_group}) on node {expected_node}")
        plan = {k: v for k, v in asdict(seat).items() if k != "cores"}
        rows.append({**plan, "pinned": seat.cores is not None, **report})
    return rows


def format_layout(rows: Sequence[dict]) -> str:
    """The layout as a short table for the console."""
    lines = ["actor layout (role rank | group/bundle | node | device gpus | cores):"]
    for r in rows:
        cores = r.get("cores")
        lines.append(f"  {r['role']:<7} {r['rank']:<2} | {r['group']}/{r['bundle']} | "
                     f"{r['node_ip']} {r['node_id'][:8]} | {r['device']} {r['gpu_ids']} | "
                     f"{','.join(map(str, cores)) if cores else '-'}")
    return "\n".join(lines)
