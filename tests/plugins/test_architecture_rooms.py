"""docs/architecture.md's rooms stay true to the code: every file a room names exists, and the
line counts it gives (``wc -l``) are within 5 % of the files' today, so the map is redrawn when
a room grows or shrinks rather than drifting away from it.

Two tables are read: the rooms of ``engines/`` (a ``files`` column, paths relative to
``loongsage/engines``, a folder standing for its ``*.py`` files, and a ``lines`` column), and
the rooms of the training step (``path (lines)`` entries, relative to a distribution's source
folder; a bare file name shares the folder of the entry before it).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"
ENGINES = REPO / "loongsage-core" / "src" / "loongsage" / "engines"
SOURCES = [REPO / "loongsage-core" / "src" / "loongsage", *sorted(REPO.glob("loongsage-*/src"))]
TOLERANCE = 0.05


def lines_of(path: Path) -> int:
    files = sorted(path.glob("*.py")) if path.is_dir() else [path]
    return sum(len(f.read_text(encoding="utf-8").splitlines()) for f in files)


def table_rows(text: str, header: str) -> list[list[str]]:
    start = text.index(header)
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def find(name: str, folder: Path | None) -> Path:
    for base in ([folder] if folder else []) + SOURCES:
        if (base / name).exists():
            return base / name
    raise AssertionError(f"docs/architecture.md names {name!r}, which is not in the tree")


def engine_rooms(text: str) -> list[tuple[str, list[Path], int]]:
    rooms = []
    for room, files, lines, *_ in table_rows(text, "| room | files | lines |"):
        paths = [ENGINES / name.rstrip("/") for name in re.findall(r"`([^`]+)`", files)]
        rooms.append((room, paths, int(lines.replace(",", ""))))
    return rooms


def step_rooms(text: str) -> list[tuple[str, list[Path], int]]:
    rooms = []
    for cell, *_ in table_rows(text, "| room (lines) |"):
        folder = None
        for name, lines in re.findall(r"`([^`]+\.py)` \((\d[\d,]*)\)", cell):
            path = find(name, folder if "/" not in name else None)
            folder = path.parent
            rooms.append((name, [path], int(lines.replace(",", ""))))
    return rooms


def drifted(text: str) -> list[str]:
    """The rooms of ``text`` whose stated line count is off by more than ``TOLERANCE``."""
    rooms = engine_rooms(text) + step_rooms(text)
    assert len(rooms) >= 20, f"the two room tables were not found whole: {[r[0] for r in rooms]}"
    wrong = []
    for room, paths, stated in rooms:
        missing = [p for p in paths if not p.exists()]
        assert not missing, f"room {room!r} names files that do not exist: {missing}"
        actual = sum(lines_of(p) for p in paths)
        if abs(actual - stated) > TOLERANCE * actual:
            wrong.append(f"{room}: the doc says {stated} lines, the files have {actual}")
    return wrong


def test_every_room_names_files_that_exist_with_their_line_counts():
    wrong = drifted(DOC.read_text(encoding="utf-8"))
    assert not wrong, "docs/architecture.md's line counts drifted:\n" + "\n".join(wrong)


def test_a_room_whose_count_drifts_is_caught():
    text = re.sub(r"(\| `mesh_sync.py` \| )[\d,]+", r"\g<1>9", DOC.read_text(encoding="utf-8"))
    assert drifted(text) == [f"TransferMesh sync: the doc says 9 lines, the files have {lines_of(ENGINES / 'mesh_sync.py')}"]
