"""Every ``torch`` name LoongSage's sources use, resolved against the installed torch.

The lent GPU machine has PyTorch 2.11; this repository pins 2.13 (CPU) and nothing here can
install 2.11 to try. So ``benchmarks/gpu_check.py`` runs this first on the machine itself: it
reads the sources (``ast``, no import), collects each dotted name rooted at ``torch`` (``torch.
distributed.fsdp.fully_shard``, ``from torch.x import y``) and resolves it by importing the
longest module prefix and walking the attributes. A name that does not resolve is an API newer
(or older) than the installed torch. What it cannot see: keyword arguments, behaviour
changes, and names reached through a variable (``dist = torch.distributed; dist.new_api``
resolves only ``torch.distributed``).

    python3 benchmarks/torch_api.py [PATH ...]   # default: the code gpu_check.py runs
"""

from __future__ import annotations

import ast
import importlib
import json
import sys
from pathlib import Path
from typing import Iterable

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PATHS = (ROOT / "loongsage-core" / "src" / "loongsage", ROOT / "benchmarks")


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "torch":
        return ".".join(["torch", *reversed(parts)])
    return None


def torch_names(source: str) -> set[str]:
    """The dotted ``torch`` names one module's source uses (longest attribute chains only)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child.parent = node  # type: ignore[attr-defined]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and (node.module == "torch" or node.module.startswith("torch.")):
            names |= {f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*"}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name == "torch" or a.name.startswith("torch.")}
        elif isinstance(node, ast.Attribute) and not isinstance(getattr(node, "parent", None), ast.Attribute):
            name = _dotted(node)
            if name:
                names.add(name)
    return names


def names_in(paths: Iterable[Path]) -> dict[str, list[str]]:
    """Each dotted torch name -> the files using it."""
    found: dict[str, list[str]] = {}
    for path in paths:
        for file in sorted([path] if path.is_file() else path.rglob("*.py")):
            where = str(file.relative_to(ROOT)) if file.is_relative_to(ROOT) else str(file)
            for name in torch_names(file.read_text(encoding="utf-8")):
                found.setdefault(name, []).append(where)
    return found


def resolves(name: str) -> bool:
    """Whether ``name`` (``torch.a.b.c``) is a module or an attribute chain of the installed torch."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def check(paths: Iterable[Path] = DEFAULT_PATHS) -> dict:
    """{"torch": version, "names": how many, "missing": {name: [files]}}."""
    import torch

    found = names_in(paths)
    missing = {name: files for name, files in sorted(found.items()) if not resolves(name)}
    return {"torch": torch.__version__, "names": len(found), "missing": missing}


def main(argv: list[str] | None = None) -> int:
    paths = [Path(p).resolve() for p in (argv if argv is not None else sys.argv[1:])] or list(DEFAULT_PATHS)
    result = check(paths)
    print(json.dumps(result))
    return 1 if result["missing"] else 0


if __name__ == "__main__":
    sys.exit(main())
