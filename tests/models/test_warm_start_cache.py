"""tests/warm_starts.py: a warm start is built once per key, under a lock shared by processes,
anew when a source file changes, and never reused half-built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from warm_starts import cached, source_digest


BUILDER = """
import sys, time
from pathlib import Path
from warm_starts import cached

root, count = Path(sys.argv[1]), Path(sys.argv[2])

def build(folder):
    with open(count, "a") as f:
        f.write("built\\n")
    time.sleep(1.0)  # long enough for the other process to reach the lock
    (folder / "sft_model").mkdir()

print(cached("recipe", tuple(sys.argv[3:]), build, cache_root=root))
"""


def _start(root: Path, count: Path, *key: str) -> subprocess.Popen:
    tests_dir = str(Path(__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests_dir, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", BUILDER, str(root), str(count), *key],
                            stdout=subprocess.PIPE, text=True, env=env)


def test_two_processes_build_a_key_once_and_share_the_folder(tmp_path):
    count = tmp_path / "count"
    procs = [_start(tmp_path, count, "a", "b") for _ in range(2)]
    folders = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert [p.returncode for p in procs] == [0, 0]
    assert count.read_text().splitlines() == ["built"]
    [folder] = folders
    assert (Path(folder) / "sft_model").is_dir()
    other = _start(tmp_path, count, "a", "c").communicate(timeout=120)[0].strip()
    assert other != folder and count.read_text().count("built") == 2


def test_a_failed_build_is_not_reused(tmp_path):
    def broken(folder: Path) -> None:
        (folder / "sft_model").mkdir()
        raise RuntimeError("sft died")

    with pytest.raises(RuntimeError, match="sft died"):
        cached("recipe", ("x",), broken, cache_root=tmp_path)
    built = []
    folder = cached("recipe", ("x",), lambda f: built.append((f / "sft_model").mkdir()), cache_root=tmp_path)
    assert built and (folder / "done").exists()


def test_the_key_follows_the_distributions_sources(tmp_path):
    src = tmp_path / "loongsage-core" / "src" / "loongsage"
    src.mkdir(parents=True)
    (src / "sft.py").write_text("steps = 1\n")
    (tmp_path / "README.md").write_text("docs do not count\n")
    before = source_digest(tmp_path)
    (tmp_path / "README.md").write_text("edited\n")
    assert source_digest(tmp_path) == before
    (src / "sft.py").write_text("steps = 2\n")
    assert source_digest(tmp_path) != before
