"""The install commands LoongSage's error messages print, each one a command that works.

The distributions are not on a package index: a sibling installs from a clone of the
repository, with the wheels ``make wheels`` builds into ``dist/`` (the README's install, which
``.ci/wheels`` runs as it stands). An extra of an installed distribution (``loongsage-core[lora]``)
would need its distribution from an index too, so its hint installs what the extra adds, read
from the installed distribution's metadata (``tensorboard>=2.14``).
"""

from __future__ import annotations

from importlib import metadata

CLONE = "in a clone of LoongSage: "  # prefix of a command that runs at the top of a clone


def distribution_command(distribution: str) -> str:
    """How to install ``distribution`` (``loongsage-algos``), the command last so it can be copied."""
    return f"{CLONE}make wheels && pip install dist/{distribution.replace('-', '_')}-*.whl"


def extra_command(distribution: str, extra: str) -> str:
    """``pip install`` of the requirements the extra ``extra`` of the installed ``distribution`` adds."""
    marker = f'extra == "{extra}"'
    try:
        requires = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        requires = []
    wanted = [req.split(";")[0].strip().replace(" ", "") for req in requires if marker in req]
    if not wanted:  # no metadata to read: the wheel with its extra, from the clone
        return f"{CLONE}make wheels && pip install \"$(ls dist/{distribution.replace('-', '_')}-*.whl)[{extra}]\""
    return "pip install " + " ".join(f"'{req}'" for req in wanted)
