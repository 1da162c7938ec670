"""A checkpoint's manifest: the size and SHA-256 of every file, written last, checked on resume.

``RunDirectory`` writes a checkpoint into a temporary folder, then ``manifest.json`` (this
module), then renames the folder into place: a folder named ``step_*`` without a manifest was
never completed, and a file whose size or checksum differs from its manifest entry was
truncated or damaged after the fact (a full disk, a copy cut short, a stray ``rm``). Without
it a resume that found ``train_state.pt`` missing silently restarted the optimizer and the RNG,
and a truncated weights file ended in a raw ``SafetensorError`` naming neither file nor step.

``problems(folder, checksums=False)`` compares sizes only (a ``stat`` per file): cheap enough for
the run's own questions (is there a checkpoint to name in an error?); a resume also reads
every byte (SHA-256: 1.2 GB/s measured on one core of a shared CPU machine, so about 12 s per
15 GB of checkpoint, on every save and every resume).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

MANIFEST = "manifest.json"
FORMAT = 1
CHUNK = 1 << 20


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() != MANIFEST)


def write_manifest(folder: Path) -> int:
    """Write ``folder/manifest.json`` for every file under ``folder``; return their total bytes."""
    entries = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)}
               for p in _files(folder)}
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps({"format": FORMAT, "files": entries}, indent=1), encoding="utf-8")
    tmp.rename(folder / MANIFEST)
    return sum(entry["size"] for entry in entries.values())


def read_manifest(folder: Path) -> dict[str, dict]:
    """The manifest's file entries; ``ValueError`` saying what is wrong with it."""
    path = folder / MANIFEST
    if not path.is_file():
        raise ValueError(f"{MANIFEST} is missing (the checkpoint was never completed)")
    try:
        files = json.loads(path.read_text(encoding="utf-8"))["files"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{MANIFEST} is unreadable ({type(err).__name__}: {err})") from None
    return files


def checkpoint_bytes(folder: Path) -> int | None:
    """What the checkpoint in ``folder`` holds, by its manifest (``None`` without one)."""
    try:
        return sum(int(entry["size"]) for entry in read_manifest(folder).values())
    except ValueError:
        return None


def problems(folder: Path, checksums: bool = True) -> list[str]:
    """Every way ``folder`` differs from its manifest: ``[]`` when it is intact."""
    try:
        files = read_manifest(folder)
    except ValueError as err:
        return [str(err)]
    found = []
    for name, entry in files.items():
        path = folder / name
        if not path.is_file():
            found.append(f"{name} is missing")
        elif (size := path.stat().st_size) != entry["size"]:
            found.append(f"{name} has {size} bytes, the manifest says {entry['size']} (truncated or overwritten)")
        elif checksums and _sha256(path) != entry["sha256"]:
            found.append(f"{name} does not match its SHA-256 in the manifest (damaged)")
    return found
