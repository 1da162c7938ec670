"""Peak memory of whole commands (a training run and everything it starts), one after another.

Each ``--run`` command is started in its own session and its process tree is sampled every
``--interval`` seconds from /proc: summed PSS (shared pages divided among the processes that
map them: what the run takes from the machine), summed RSS (shared pages counted once per
process), per process its RSS and PSS peaks, and the CPU seconds of the whole tree (on a
shared machine a steadier figure than wall time). A ``loongsage train`` run prints
``actor processes: train <pid>, rollout0 <pid>``; those processes are reported under their
role names (``train+rollout0`` for a process holding both, ``placement.share_process``),
every other big process under its command line. With several ``--run`` the
table gives each one's peak PSS as a ratio of the first's.

    .venv/bin/python benchmarks/memory.py --run "loongsage train --config-name smollm2/grpo" [--json]
    .venv/bin/python benchmarks/memory.py --run "CMD A" --run "CMD B"   # B's peak / A's
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from loongsage.controller.memory import GB, cpu_seconds, process_tree, pss_bytes, rss_bytes

ROLES = re.compile(r"^actor processes: (.*)$")


@dataclass
class Peaks:
    """Peaks of one command's process tree (bytes) and what was running at the PSS peak."""

    command: str
    pss: int = 0
    rss: int = 0
    at_s: float = 0.0
    wall_s: float = 0.0
    returncode: int | None = None
    cpu_s: float = 0.0  # user + system seconds of every process seen (last sample of each)
    per_process: dict[str, dict[str, int]] = field(default_factory=dict)
    at_peak: dict[str, int] = field(default_factory=dict)


def _label(pid: int, roles: dict[int, str]) -> str:
    if pid in roles:
        return roles[pid]
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            words = handle.read().split(b"\0")
    except OSError:
        return str(pid)
    return " ".join(w.decode(errors="replace") for w in words if w)[:60] or str(pid)


def measure(command: str, interval: float, echo: bool, min_rss: float = 0.1 * GB) -> Peaks:
    """Run ``command`` to the end, sampling its process tree; return its peaks (per process:
    those whose RSS reached ``min_rss`` bytes)."""
    peaks = Peaks(command)
    roles: dict[int, str] = {}
    by_pid: dict[int, dict] = {}
    at_peak: dict[int, int] = {}
    cpu: dict[int, float] = {}
    start = time.monotonic()
    proc = subprocess.Popen(shlex.split(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)

    def read_output() -> None:
        for line in proc.stdout:
            if echo:
                sys.stdout.write(line)
            found = ROLES.match(line.strip())
            if found:
                for role, pid in re.findall(r"(\w+) (\d+)", found.group(1)):  # shared: train+rollout0
                    roles[int(pid)] = f"{roles[int(pid)]}+{role}" if int(pid) in roles else role

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    try:
        while proc.poll() is None:
            tree = process_tree(proc.pid)
            sample = {pid: (rss_bytes(pid), pss_bytes(pid)) for pid in tree}
            cpu.update({pid: max(cpu.get(pid, 0.0), cpu_seconds(pid)) for pid in tree})
            pss, rss = sum(p for _, p in sample.values()), sum(r for r, _ in sample.values())
            for pid, (r, p) in sample.items():
                if r >= min_rss:  # Ray renames its workers as they take tasks: keep the latest name
                    entry = by_pid.setdefault(pid, {"rss": 0, "pss": 0})
                    entry["rss"], entry["pss"] = max(entry["rss"], r), max(entry["pss"], p)
                    entry["label"] = _label(pid, roles)
            if pss > peaks.pss:
                peaks.pss, peaks.at_s = pss, time.monotonic() - start
                at_peak = {pid: p for pid, (_, p) in sample.items() if p >= 0.1 * GB}
            peaks.rss = max(peaks.rss, rss)
            time.sleep(interval)
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        raise
    reader.join(timeout=10)
    peaks.returncode, peaks.wall_s = proc.wait(), time.monotonic() - start
    peaks.cpu_s = sum(cpu.values())
    # label at the end: the role names arrive after the actors' first samples
    peaks.per_process = {roles.get(pid, e["label"]) + ("" if pid in roles else f" [{pid}]"):
                         {"rss": e["rss"], "pss": e["pss"]} for pid, e in by_pid.items()}
    peaks.at_peak = {roles.get(pid, by_pid.get(pid, {}).get("label", str(pid))): p for pid, p in at_peak.items()}
    return peaks


def report(results: list[Peaks]) -> str:
    lines = []
    first = results[0].pss or 1
    for r in results:
        lines.append(f"{r.command}\n  exit {r.returncode}, wall {r.wall_s:.0f} s, CPU {r.cpu_s:.0f} s; peak summed PSS "
                     f"{r.pss / GB:.2f} GB at {r.at_s:.0f} s ({r.pss / first:.2f}x the first), "
                     f"peak summed RSS {r.rss / GB:.2f} GB")
        for name, entry in sorted(r.per_process.items(), key=lambda kv: -kv[1]["pss"]):
            lines.append(f"    {name:<60} peak RSS {entry['rss'] / GB:6.2f} GB  PSS {entry['pss'] / GB:6.2f} GB")
        held = ", ".join(f"{name} {p / GB:.2f}" for name, p in sorted(r.at_peak.items(), key=lambda kv: -kv[1]))
        lines.append(f"  at the PSS peak (GB): {held}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, help="command to measure (repeatable)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quiet", action="store_true", help="do not echo the commands' output")
    parser.add_argument("--min-rss-gb", type=float, default=0.1, help="list processes whose RSS reached this")
    args = parser.parse_args()
    results = [measure(command, args.interval, echo=not (args.quiet or args.json), min_rss=args.min_rss_gb * GB)
               for command in args.run]
    if args.json:
        print(json.dumps({"runs": [r.__dict__ for r in results],
                          "peak_pss_ratio": [r.pss / (results[0].pss or 1) for r in results]}))
    else:
        print(report(results))
    return max(r.returncode or 0 for r in results)


if __name__ == "__main__":
    sys.exit(main())
