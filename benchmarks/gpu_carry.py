"""What travels to a lent GPU machine: the pinned wheels, Ray cut down to fit, and the size check.

The GPU machine (Python 3.12, PyTorch 2.11) can fetch nothing; a command's files travel with
the working tree, at most 64 MiB per call (tracked files, untracked files git does not ignore,
the checkout's ``shared/`` and the carried paths). ``benchmarks/gpu_wheels.sh`` downloads the
wheels named in ``benchmarks/gpu_wheels.txt`` and calls this module to:

``prune``  rewrite Ray's wheel without what a local cluster of Python actors never loads: the
           Java worker jar (32 MB of the 79 MB cp312 wheel), the dashboard's web client and
           the Ray libraries LoongSage does not use (RLlib, Tune, Train, Data, Serve, LLM).
           Its RECORD loses the same entries, so ``pip install`` sees a consistent wheel.
``size``   add up what one call would carry and fail when it is over the limit.

    python3 benchmarks/gpu_carry.py prune WHEEL
    python3 benchmarks/gpu_carry.py size REPO CARRIED_DIR [...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import zipfile
from pathlib import Path

LIMIT_BYTES = 64 << 20  # what one call carries: working tree + carried paths

# Ray's parts a local cluster of Python actors never imports or starts.
RAY_UNUSED = ("ray/jars/", "ray/rllib/", "ray/tune/", "ray/train/", "ray/data/", "ray/serve/",
              "ray/llm/", "ray/dashboard/client/build/")


def prune_wheel(wheel: Path, drop: tuple[str, ...] = RAY_UNUSED) -> tuple[int, int]:
    """Rewrite ``wheel`` in place without the members under ``drop``; return (bytes before, after)."""
    before = wheel.stat().st_size
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        for info in src.infolist():
            if info.filename.startswith(drop):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                kept = [line for line in data.decode().splitlines() if not line.startswith(drop)]
                data = ("\n".join(kept) + "\n").encode()
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    os.replace(tmp, wheel)
    return before, wheel.stat().st_size


def travelling_bytes(repo: Path) -> int:
    """Bytes of the working tree that travels: tracked and untracked-not-ignored files, and
    the checkout's ``shared/`` folder if it has one (it travels even where git ignores it)."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "-co", "--exclude-standard"],
                            check=True, capture_output=True).stdout.split(b"\0")
    files = {repo / os.fsdecode(name) for name in listed if name}
    shared = repo / "shared"
    if shared.is_dir():
        files |= {p for p in shared.rglob("*") if p.is_file() and not p.is_symlink()}
    return sum(p.stat().st_size for p in files if p.is_file() and not p.is_symlink())


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def carry_report(repo: Path, carried: list[Path], limit: int = LIMIT_BYTES) -> dict:
    """The bytes one call would carry, and whether they fit under ``limit``."""
    tree = travelling_bytes(repo)
    parts = {str(p.relative_to(repo)): folder_bytes(p) for p in carried}
    total = tree + sum(parts.values())
    return {"working_tree": tree, "carried": parts, "total": total, "limit": limit,
            "fits": total <= limit, "headroom": limit - total}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    prune = sub.add_parser("prune", help="cut Ray's wheel down (in place)")
    prune.add_argument("wheel", type=Path)
    size = sub.add_parser("size", help="check one call's bytes against the limit")
    size.add_argument("repo", type=Path)
    size.add_argument("carried", type=Path, nargs="+")
    args = parser.parse_args(argv)
    if args.cmd == "prune":
        before, after = prune_wheel(args.wheel)
        print(f"{args.wheel.name}: {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB")
        return 0
    repo = args.repo.resolve()
    report = carry_report(repo, [p.resolve() for p in args.carried])
    mib = {k: round(v / 2**20, 1) for k, v in report["carried"].items()}
    print(f"one call carries {report['total'] / 2**20:.1f} MiB of {report['limit'] / 2**20:.0f} MiB: "
          f"working tree {report['working_tree'] / 2**20:.1f} MiB, carried {mib}")
    if not report["fits"]:
        print(f"over the limit by {-report['headroom'] / 2**20:.1f} MiB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
