"""Shared pieces of the real-CLI launchers: finding the binary, reading JSON-lines output.

The npm CLIs are looked up in ``params.bin_dir``, else in the LoongSage npm cache
(``$LOONGSAGE_CACHE/npm/node_modules/.bin``, default ``~/.cache/loongsage/npm``, where
``ensure_npm_clis`` installs them), else on ``PATH``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

# the versions the tests were run with (REFERENCE.md §5.2 records their wire behaviour)
NPM_PACKAGES = {"codex": "@openai/codex@0.171.0", "claude": "@anthropic-ai/claude-code@2.1.197",
                "opencode": "opencode-ai@1.18.33"}


def npm_prefix() -> Path:
    root = Path(os.environ.get("LOONGSAGE_CACHE", Path.home() / ".cache" / "loongsage"))
    return root / "npm"


def find_binary(name: str, bin_dir: str | None) -> str:
    """The path of CLI ``name``; a clear error naming how to install it when missing."""
    candidates = [Path(bin_dir) / name] if bin_dir else [npm_prefix() / "node_modules" / ".bin" / name]
    for path in candidates:
        if path.exists():
            return str(path)
    found = shutil.which(name)
    if found:
        return found
    package = NPM_PACKAGES.get(name, name)
    raise FileNotFoundError(
        f"agent CLI '{name}' not found in {[str(c) for c in candidates]} or on PATH; install it "
        f"with: npm install --prefix {npm_prefix()} {package} (or set agent.params.bin_dir)")


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
