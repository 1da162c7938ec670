"""Memory of a run's processes: RSS and PSS read from /proc, per-step figures and peaks.

RSS counts every page a process maps, so pages shared between processes (the weight-sync
ring, torch's libraries) count once per process and a sum of RSS over-counts; PSS divides
each shared page among the processes that map it, so summed PSS is what the run really
takes from the machine. Per-actor figures are RSS (what Ray's memory monitor and ``top``
show); the run total is the summed PSS of the driver and every process below it (a local
Ray cluster's raylet, workers and actors are all children of the driver).

Peaks come from a ``PeakSampler`` thread (RSS of its own process every 50 ms in each
actor, the run's summed PSS every second in the driver), so a peak that lasts a fraction
of a step is still seen. The driver reads PSS only when it can have grown (``TreePss``):
``smaps_rollup`` walks a process's page tables, and reading the whole tree every second
cost the driver 3-5 CPU-seconds of a 5-step agentic run, CPU the rollout needed.
Figures are bytes; metrics are GB (1e9 bytes).

The same tree's CPU seconds per step (``perf/run_cpu_s``) sit beside its memory: where the
whole run shares one machine's cores (a laptop, a CPU node), they are the work any schedule of
the step has to fit onto those cores, so ``cpu_s / cores`` bounds from below how short a step
can get, whatever overlaps what (with OpenMP waits passive: a spinning wait is CPU time too).
Processes that ended inside the tree (bubblewrap sandboxes, test runs) count through their
parent's reaped-children time; what runs outside it (a Docker sandbox under its daemon, a
remote node) does not.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

GB = 1e9
SUMMARY_LABELS = {"train": "train actor", "rollout": "rollout engine"}  # other roles' actors: their role
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

log = logging.getLogger(__name__)


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of ``pid`` (0 when the process is gone or /proc is missing)."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def pss_bytes(pid: int | str = "self") -> int:
    """Proportional set size of ``pid`` from ``smaps_rollup`` (0 when unreadable)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        return 0
    return 0


def process_tree(root: int) -> list[int]:
    """``root`` and every live process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    tree, stack = [], [root]
    while stack:
        pid = stack.pop()
        tree.append(pid)
        stack.extend(children.get(pid, []))
    return tree


def cpu_seconds(pid: int | str = "self", reaped: bool = False) -> float:
    """User + system CPU seconds ``pid`` has used so far; with ``reaped``, plus those of the
    children it has waited for. 0 when the process is gone or /proc is missing."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        used = fields[11:15] if reaped else fields[11:13]  # utime, stime (, cutime, cstime)
        ticks = sum(int(value) for value in used)
    except (OSError, IndexError, ValueError):
        return 0.0
    return ticks / _TICK


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds used so far by ``root``, every live process below it, and what they reaped."""
    return sum(cpu_seconds(pid, reaped=True) for pid in process_tree(root))


def tree_pss_bytes(root: int) -> int:
    """Summed PSS of ``root`` and its descendants: what the process tree takes from the machine."""
    return sum(pss_bytes(pid) for pid in process_tree(root))


class TreePss:
    """The summed PSS of ``root``'s process tree, re-read only when it can have changed much.

    Summed RSS (``statm``, nearly free) moves with every page the tree maps or frees, and
    summed PSS by no more than that, so a call re-reads PSS when summed RSS has moved by more
    than ``slack`` bytes since the last reading, or ``max_age_s`` has passed; otherwise the
    last reading stands. A figure is off by at most about ``slack`` (more only when a process
    outside the tree that shares pages with it exits meanwhile).
    """

    def __init__(self, root: int, slack: int = 64 << 20, max_age_s: float = 10.0) -> None:
        self.root, self.slack, self.max_age_s = root, slack, max_age_s
        self.readings = 0  # how many times PSS was really read
        self._pss = self._rss = 0
        self._at = -math.inf

    def __call__(self) -> int:
        pids = process_tree(self.root)
        rss = sum(rss_bytes(pid) for pid in pids)
        now = time.monotonic()
        if abs(rss - self._rss) > self.slack or now - self._at > self.max_age_s:
            self._pss, self._rss, self._at = sum(pss_bytes(pid) for pid in pids), rss, now
            self.readings += 1
        return self._pss


def machine_memory() -> tuple[int, int]:
    """``(total, available)`` bytes of this machine, capped by a cgroup v2 limit when set."""
    fields = {}
    with open("/proc/meminfo", encoding="ascii") as handle:
        for line in handle:
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0]) * 1024
    total, available = fields["MemTotal"], fields.get("MemAvailable", fields["MemFree"])
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as handle:
            limit = handle.read().strip()
        with open("/sys/fs/cgroup/memory.current", encoding="ascii") as handle:
            used = int(handle.read().strip())
    except OSError:
        return total, available
    if limit.isdigit() and int(limit) < total:
        return int(limit), min(available, int(limit) - used)
    return total, available


class PeakSampler:
    """Samples ``read()`` every ``interval_s`` on a daemon thread and keeps the maximum.

    ``take()`` returns the peak since the previous ``take()`` (including the value now) and
    starts a new window; ``overall`` is the peak since the sampler started.
    """

    def __init__(self, read: Callable[[], int], interval_s: float) -> None:
        self._read = read
        self._interval = interval_s
        self._lock = threading.Lock()
        self._window = self.overall = read()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="loongsage-memory", daemon=True)
        self._thread.start()

    def _note(self, value: int) -> None:
        with self._lock:
            self._window = max(self._window, value)
            self.overall = max(self.overall, value)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._note(self._read())

    def take(self) -> int:
        now = self._read()
        self._note(now)
        with self._lock:
            peak, self._window = self._window, now
        return peak

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass
class ActorMemory:
    """One actor's memory, as its host reports it (``EngineHost.memory``)."""

    pid: int
    rss: int  # now
    peak_rss: int  # since the previous report


def is_train_role(role: str) -> bool:
    """``train`` or ``train<rank>`` (``RunMemory.for_run``'s role names)."""
    return role == "train" or (role.startswith("train") and role[5:].isdigit())


@dataclass
class RunMemory:
    """The driver's view: per-step memory metrics of every actor, the run's peaks and CPU time.

    ``actors`` maps a role name (``train``, ``rollout0``...) to its actor handle; ``local``
    says whether the actors are processes below the driver (a local cluster), which is when
    the run's summed PSS can be measured.
    """

    actors: dict[str, Any]
    local: bool
    peaks: dict[str, float] = field(default_factory=dict)
    last: dict[str, ActorMemory] = field(default_factory=dict)
    _run: PeakSampler | None = None
    _cpu_s: float = field(default=0.0, init=False)  # the tree's CPU seconds at the previous call

    def __post_init__(self) -> None:
        if self.local:
            self._run = PeakSampler(TreePss(os.getpid()), interval_s=1.0)
            self._cpu_s = tree_cpu_seconds(os.getpid())

    @classmethod
    def for_run(cls, cfg: Any, train_actors: list, rollout_actors: list,
                others: dict | None = None) -> "RunMemory":
        """The run's train ranks, rollout engines and ``others`` (role -> actor: the step terms'
        actors); logs their process ids (for ``top``).

        One train rank is ``train``; with data parallelism they are ``train0``, ``train1``...
        """
        remote = cfg.placement.ray_address or os.environ.get("RAY_ADDRESS")
        trainers = {"train": train_actors[0]} if len(train_actors) == 1 else {
            f"train{r}": a for r, a in enumerate(train_actors)}
        actors = {**trainers, **{f"rollout{i}": a for i, a in enumerate(rollout_actors)}, **(others or {})}
        memory = cls(actors, local=not remote)
        pids = ", ".join(f"{role} {pid}" for role, pid in memory.pids().items())
        log.info(f"actor processes: {pids}")
        return memory

    def pids(self) -> dict[str, int]:
        """Role -> process id of every reachable actor."""
        return {role: report.pid for role, report in self._reports().items()}

    def _reports(self) -> dict[str, ActorMemory]:
        """Every answering actor's report; one that died or hangs is left out (a rollout engine
        the engine monitor is restarting; a dead train actor fails the step by itself)."""
        if not self.actors:
            return {}
        import ray

        refs = {role: actor.memory.remote(release=True) for role, actor in list(self.actors.items())}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=60)
        reports = {}
        for role, ref in refs.items():
            try:
                reports[role] = ActorMemory(**ray.get(ref)) if ref in ready else None
            except ray.exceptions.RayActorError:
                reports[role] = None
        self.last = {role: report for role, report in reports.items() if report is not None}
        return self.last

    def step_metrics(self) -> dict[str, float]:
        """``perf/*_gb`` and ``perf/run_cpu_s`` for the step that just ended; peaks and CPU
        time are since the previous call (so they include evaluations and checkpoints between).

        ``perf/train_rss_gb`` is the (largest) train rank's RSS at the end of the step (after
        handing freed heap memory back, ``release_free_memory``) and
        ``perf/train_rss_peak_gb`` its peak during the step; the rollout figures (and those of
        any other role's actors: a step term's) are the largest engine's (actor's);
        ``perf/run_pss_peak_gb`` is the whole run's summed PSS at its peak during the step and
        ``perf/run_cpu_s`` the CPU seconds the whole run used since the previous call
        (``tree_cpu_seconds``; local clusters only).
        """
        reports = self._reports()
        by_kind: dict[str, list[ActorMemory]] = {}
        for role, report in reports.items():
            by_kind.setdefault(role.rstrip("0123456789"), []).append(report)
        metrics = {}
        for kind, group in sorted(by_kind.items()):
            metrics[f"perf/{kind}_rss_gb"] = max(r.rss for r in group) / GB
            metrics[f"perf/{kind}_rss_peak_gb"] = max(r.peak_rss for r in group) / GB
        if self._run is not None:
            metrics["perf/run_pss_peak_gb"] = self._run.take() / GB
            cpu_s, self._cpu_s = self._cpu_s, tree_cpu_seconds(os.getpid())
            # a process that left the tree (orphaned, reaped outside it) takes its past with it
            metrics["perf/run_cpu_s"] = max(0.0, self._cpu_s - cpu_s)
        for key, value in metrics.items():
            if key.endswith("_peak_gb"):
                self.peaks[key] = max(self.peaks.get(key, 0.0), value)
        return metrics

    def summary(self) -> dict[str, float]:
        """The run's peaks so far (GB): train actor, largest rollout engine, whole run."""
        out = dict(self.peaks)
        if self._run is not None:
            out["perf/run_pss_peak_gb"] = max(out.get("perf/run_pss_peak_gb", 0.0), self._run.overall / GB)
        return out

    def summary_line(self) -> str:
        peaks = self.summary()
        found = [key.split("/")[1].removesuffix("_rss_peak_gb") for key in peaks if key.endswith("_rss_peak_gb")]
        kinds = [kind for kind in SUMMARY_LABELS if kind in found] + sorted(set(found) - set(SUMMARY_LABELS))
        names = [(f"perf/{kind}_rss_peak_gb", f"{SUMMARY_LABELS.get(kind, kind)} RSS") for kind in kinds]
        names.append(("perf/run_pss_peak_gb", "whole run PSS"))
        parts = [f"{label} {peaks[key]:.2f} GB" for key, label in names if key in peaks]
        total, _ = machine_memory()
        return f"memory peak: {', '.join(parts)} (machine {total / GB:.1f} GB)"

    def close(self) -> None:
        if self._run is not None:
            self._run.close()
