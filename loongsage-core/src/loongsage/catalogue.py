"""Which sibling distribution provides which plugin names, for the hint of an unknown name.

When a config names a plugin that no loaded distribution registered, the error says which
distribution brings it and how to install it. That hint matters exactly when the distribution
is *not* installed, so neither its metadata nor its entry points can be read then: what each
sibling registers has to ship with core, as data (``sibling_plugins.json``, package data).

Core's code names none of those plugins, and only reads the file. It is generated in a
clone, never edited: ``make catalogue`` (``tests/sibling_catalogue.py``) loads the plugins of
the installed siblings and writes down what each one registers, kind by kind. The siblings'
own hook implementations are thus the one declaration of their names (no second list in
their metadata to drift from them), and ``tests/plugins/test_catalogue.py`` regenerates the
file and fails when it differs, so a sibling that registers a new name fails the tests
until ``make catalogue`` is run.
"""

from __future__ import annotations

import functools
import json
import os
from importlib import metadata, resources

from loongsage.install_hints import distribution_command

CATALOGUE_FILE = "sibling_plugins.json"  # next to this module, in the core wheel (package data)
Providers = dict[str, dict[str, list[str]]]  # distribution -> kind -> names it registers


@functools.cache
def shipped() -> Providers:
    """The providers of the ``sibling_plugins.json`` this installation of core ships."""
    text = resources.files("loongsage").joinpath(CATALOGUE_FILE).read_text(encoding="utf-8")
    return json.loads(text)["providers"]


def provider(kind: str, name: str) -> str | None:
    """The sibling distribution that registers ``name`` as a ``kind``, if any."""
    for distribution, kinds in shipped().items():
        if name in kinds.get(kind, ()):
            return distribution
    return None


def is_installed(distribution: str) -> bool:
    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def _why_not_loaded() -> str:
    if os.environ.get("LOONGSAGE_DISABLE_PLUGIN_AUTOLOAD"):
        return "LOONGSAGE_DISABLE_PLUGIN_AUTOLOAD is set"
    if os.environ.get("LOONGSAGE_LOAD_PLUGINS") is not None:
        return "LOONGSAGE_LOAD_PLUGINS does not name it"
    return "its entry point was not loaded"


def install_hint(kind: str, name: str) -> str:
    """Where ``name`` comes from and how to get it, or "" when no sibling provides it.

    For example ``'NAME' (policy_loss) comes with loongsage-algos, which is not installed; in a
    clone of LoongSage: make wheels && pip install dist/loongsage_algos-*.whl`` (the command last,
    so it can be copied as it stands).
    """
    distribution = provider(kind, name)
    if distribution is None:
        return ""
    what = f"'{name}' ({kind}) comes with {distribution}, which"
    if is_installed(distribution):
        return f" {what} is installed but not loaded ({_why_not_loaded()})."
    return f" {what} is not installed; {distribution_command(distribution)}"
