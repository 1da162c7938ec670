"""Generate core's ``loongsage/sibling_plugins.json`` from what the siblings register.

The install hints (``loongsage.catalogue``) read that file; it is never edited by hand.
``make catalogue`` runs ``python tests/sibling_catalogue.py``, which loads every installed
distribution's plugins and writes, for each sibling of this repository (a
``loongsage-*/pyproject.toml`` with a ``loongsage`` entry point, core apart), the names it
registers kind by kind. ``tests/plugins/test_catalogue.py`` renders the same text and
compares it with the file, so a sibling registering a new name fails until this is run.
It lives in the repository, not in core: it needs the siblings' sources and installs.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path

from loongsage.catalogue import CATALOGUE_FILE, Providers, is_installed
from loongsage.registry import Registries

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "loongsage-core" / "src" / "loongsage" / CATALOGUE_FILE
GENERATED_BY = "make catalogue (tests/sibling_catalogue.py): what the siblings register; do not edit"


def siblings() -> list[str]:
    """The repository's distributions with a ``loongsage`` entry point, core apart."""
    names = []
    for pyproject in sorted(REPO.glob("loongsage-*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        if project["name"] != "loongsage-core" and "loongsage" in project.get("entry-points", {}):
            names.append(project["name"])
    return sorted(names)


def collect(registries: Registries, distributions: list[str]) -> Providers:
    """What each of ``distributions`` registers in ``registries``: kind -> sorted names."""
    found: Providers = {d: {} for d in distributions}
    for registry in registries:
        for entry in registry:  # sorted by name
            if entry.distribution in found:
                found[entry.distribution].setdefault(registry.kind, []).append(entry.name)
    return found


def render(providers: Providers) -> str:
    """The file's text, in one canonical form (sorted keys), so a test can compare it whole."""
    return json.dumps({"generated_by": GENERATED_BY, "providers": providers}, indent=2, sort_keys=True) + "\n"


def main() -> int:
    from loongsage.plugins import load_plugins

    switches = [v for v in ("LOONGSAGE_DISABLE_PLUGIN_AUTOLOAD", "LOONGSAGE_LOAD_PLUGINS") if v in os.environ]
    absent = [d for d in siblings() if not is_installed(d)]
    if switches or absent:
        sys.exit(f"the catalogue needs every sibling installed and loaded: "
                 f"unset {switches}, install {absent}")
    providers = collect(load_plugins(), siblings())
    silent = [d for d, kinds in providers.items() if not kinds]
    if silent:
        sys.exit(f"{', '.join(silent)} registered no plugin")
    partial = TARGET.with_suffix(".tmp")
    partial.write_text(render(providers), encoding="utf-8")
    partial.replace(TARGET)
    counts = ", ".join(f"{d} {sum(map(len, kinds.values()))}" for d, kinds in providers.items())
    print(f"wrote {TARGET.relative_to(REPO)}: {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
