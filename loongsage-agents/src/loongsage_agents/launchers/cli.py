"""Shared pieces of the real-CLI launchers: finding the binary, reading JSON-lines output.

A CLI is looked up in ``params.bin_dir``, else in its LoongSage cache, else on ``PATH``. The
npm CLIs live in ``$LOONGSAGE_CACHE/npm/node_modules/.bin`` (default ``~/.cache/loongsage``;
``ensure_npm_clis`` installs them). mini-swe-agent is a Python package that pulls litellm and
dozens of pinned-elsewhere dependencies, so it gets a virtual environment of its own,
``$LOONGSAGE_CACHE/venvs/mini-swe-agent`` (``ensure_mini_swe_agent``), never the project's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

# the versions the tests were run with (docs/agents.md records their wire behaviour)
NPM_PACKAGES = {"codex": "@openai/codex@0.171.0", "claude": "@anthropic-ai/claude-code@2.1.197",
                "opencode": "opencode-ai@1.18.33"}
# pip-installed CLIs: binary -> (own venv name under $LOONGSAGE_CACHE/venvs, pinned requirement)
PIP_PACKAGES = {"mini": ("mini-swe-agent", "mini-swe-agent==2.4.6")}


def cache_root() -> Path:
    return Path(os.environ.get("LOONGSAGE_CACHE", Path.home() / ".cache" / "loongsage"))


def npm_prefix() -> Path:
    return cache_root() / "npm"


def venv_dir(name: str) -> Path:
    """The private virtual environment of pip-installed CLI ``name`` (a ``PIP_PACKAGES`` key)."""
    return cache_root() / "venvs" / PIP_PACKAGES[name][0]


def default_bin_dir(name: str) -> Path:
    """Where the LoongSage cache keeps CLI ``name``."""
    if name in PIP_PACKAGES:
        return venv_dir(name) / "bin"
    return npm_prefix() / "node_modules" / ".bin"


def install_hint(name: str) -> str:
    if name in PIP_PACKAGES:
        venv = venv_dir(name)
        return (f"python3 -m venv {venv} && {venv}/bin/pip install {PIP_PACKAGES[name][1]} "
                "(or call loongsage_agents.launchers.cli.ensure_mini_swe_agent())")
    return f"npm install --prefix {npm_prefix()} {NPM_PACKAGES.get(name, name)}"


def find_binary(name: str, bin_dir: str | None) -> str:
    """The path of CLI ``name``; a clear error naming how to install it when missing."""
    candidates = [Path(bin_dir) / name] if bin_dir else [default_bin_dir(name) / name]
    for path in candidates:
        if path.exists():
            return str(path)
    found = shutil.which(name)
    if found:
        return found
    raise FileNotFoundError(
        f"agent CLI '{name}' not found in {[str(c) for c in candidates]} or on PATH; install it "
        f"with: {install_hint(name)} (or set agent.params.bin_dir)")


def ensure_npm_clis(packages: list[str] | None = None, prefix: Path | None = None,
                    timeout_s: float = 600.0) -> Path:
    """Install the npm CLIs into the cache unless all are there; returns the ``.bin`` dir."""
    prefix = prefix or npm_prefix()
    bin_dir = prefix / "node_modules" / ".bin"
    wanted = packages or list(NPM_PACKAGES.values())
    names = [n for n, pkg in NPM_PACKAGES.items() if pkg in wanted]
    if all((bin_dir / n).exists() for n in names):
        return bin_dir
    npm = shutil.which("npm")
    if npm is None:
        raise FileNotFoundError("npm not found on PATH: install Node.js 20+ to run the agent CLIs")
    prefix.mkdir(parents=True, exist_ok=True)
    subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", *wanted],
                   check=True, timeout=timeout_s, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return bin_dir


def ensure_mini_swe_agent(venv: Path | None = None, timeout_s: float = 900.0) -> Path:
    """Create mini-swe-agent's own venv and pip-install the pinned version unless ``mini`` is
    there already; returns the venv's ``bin`` dir. The venv is built from the interpreter
    running LoongSage (its base, not the project venv) and shares nothing with the project."""
    venv = venv or venv_dir("mini")
    bin_dir = venv / "bin"
    if (bin_dir / "mini").exists():
        return bin_dir
    venv.parent.mkdir(parents=True, exist_ok=True)
    run = dict(check=True, timeout=timeout_s, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], **run)
        subprocess.run([str(bin_dir / "pip"), "install", "--quiet", "--disable-pip-version-check",
                        PIP_PACKAGES["mini"][1]], **run)
    except subprocess.CalledProcessError as err:
        out = (err.stdout or b"").decode("utf-8", "replace")[-4000:]
        raise RuntimeError(f"installing {PIP_PACKAGES['mini'][1]} into {venv} failed "
                           f"(exit {err.returncode}):\n{out}") from None
    return bin_dir


def json_lines(text: str) -> Iterator[dict[str, Any]]:
    """The JSON objects among ``text``'s lines (CLIs mix in the odd non-JSON line)."""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                yield obj
