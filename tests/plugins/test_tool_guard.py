"""``LOONGSAGE_REQUIRE_TOOLS=1`` (tests/tool_guard.py, set by ``.ci/run``) turns every skip for
want of a tool or package into a failure that names it; optional skips stay skips.

A planted test folder runs in a real pytest subprocess: a module that imports a package that
does not exist at collection (``importorskip``), a test that skips for a missing binary, and a
test whose skip is marked optional (no Docker engine)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PLANTED = '''
import shutil
import pytest
from tool_guard import optional_skip

def test_needs_a_binary():
    if shutil.which("loongsage-no-such-binary") is None:
        pytest.skip("loongsage-no-such-binary is not installed")

def test_needs_docker():
    optional_skip("no Docker engine on this machine")
'''

PLANTED_MODULE = '''
import pytest
pytest.importorskip("loongsage_no_such_package")

def test_never_collected():
    pass
'''


def _run(folder: Path, required: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LOONGSAGE_REQUIRE_TOOLS"}
    if required:
        env["LOONGSAGE_REQUIRE_TOOLS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tool_guard", "-p", "no:cacheprovider",
                           "-rA", "-o", "addopts=", str(folder)],
                          capture_output=True, text=True, env=env, cwd=folder, timeout=120)


def test_missing_tools_fail_when_required_and_skip_otherwise(tmp_path):
    (tmp_path / "test_planted.py").write_text(PLANTED)
    (tmp_path / "test_planted_module.py").write_text(PLANTED_MODULE)

    relaxed = _run(tmp_path, required=False)
    assert relaxed.returncode == 0, relaxed.stdout
    assert "3 skipped" in relaxed.stdout, relaxed.stdout

    strict = _run(tmp_path, required=True)
    assert strict.returncode != 0, strict.stdout
    out = strict.stdout
    assert "FAILED test_planted.py::test_needs_a_binary" in out, out
    assert "loongsage-no-such-binary is not installed" in out
    assert "FAILED test_planted_module.py::required_tools" in out and "loongsage_no_such_package" in out, out
    assert "SKIPPED" in out and "no Docker engine on this machine" in out, "an optional skip stays a skip"
    assert "2 failed" in out and "1 skipped" in out, out
