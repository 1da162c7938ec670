"""Typed parameters of the ``verifiers`` environment, and which verifiers environments are
installed (torch-free and verifiers-free at import: ``plugin.py`` imports this module)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Optional

BUILTIN_TASKSETS = "verifiers.v1.tasksets"  # the bridges verifiers ships (harbor, openenv, ...)


def module_of(env_id: str) -> str:
    """The module of a verifiers environment id, as verifiers resolves it: a hub id
    ``owner/name@version`` is ``name``; ``-`` becomes ``_`` (``my-env`` -> ``my_env``)."""
    return env_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()


def _requires_verifiers(dist: importlib.metadata.Distribution) -> bool:
    """Whether ``dist`` needs verifiers itself (an extra that adds it, like ours, does not count)."""
    for req in dist.requires or []:
        name, _, marker = req.partition(";")
        if re.match(r"verifiers\b(?![-_.])", name.strip(), re.IGNORECASE) and "extra" not in marker:
            return True
    return False


def installed_environments() -> list[str]:
    """The installed verifiers environments: the top-level modules of the distributions that
    depend on verifiers, and verifiers' own taskset bridges (found, not imported)."""
    found = set()
    modules_of = importlib.metadata.packages_distributions()
    requiring = {dist.metadata["Name"] for dist in importlib.metadata.distributions() if _requires_verifiers(dist)}
    for module, dists in modules_of.items():
        if set(dists) & requiring and not module.startswith("_"):
            found.add(module)
    spec = importlib.util.find_spec(BUILTIN_TASKSETS)
    if spec is not None:
        import pkgutil

        found |= {m.name for m in pkgutil.iter_modules(spec.submodule_search_locations or [])}
    return sorted(found)


def environment_found(env_id: str) -> bool:
    """Whether verifiers would find environment ``env_id`` (its module, or a built-in taskset)."""
    module = module_of(env_id)
    for name in (f"{BUILTIN_TASKSETS}.{module}", module):
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except (ImportError, ValueError):
            continue
    return False


@dataclass
class VerifiersParams:
    """An installed verifiers v1 environment (the module exporting one ``Taskset``), its
    episodes run by verifiers' own env server against each trajectory's router URL."""

    requires: ClassVar[tuple[str, str, str]] = ("verifiers", "loongsage-agents", "verifiers")

    id: str = ""  # the environment id (module name; my-env -> my_env), as vf-eval takes it
    args: Dict[str, Any] = field(default_factory=dict)  # its taskset config (vf-eval's --env.taskset.*)
    harness: str = "null"  # the agent program (vf-eval's --env.agent.harness.id); null = chat loop + MCP tools
    runtime: str = "subprocess"  # where the program runs (--env.agent.runtime.type)
    # more of the agent's config (--env.agent.*: max_turns, timeout, harness options, ...)
    agent: Dict[str, Any] = field(default_factory=dict)
    size: Optional[int] = None  # training tasks (None = every task not held out)
    held_out_size: int = 0  # tasks held out (an eval_only source reads them), disjoint from training
    seed: int = 0  # the shuffle that splits the tasks and orders the training ones
    server_start_timeout_s: float = 120.0  # for verifiers' env server to answer its health check

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("id: name an installed verifiers environment, e.g. id: adder-tools")
        if (self.size is not None and self.size < 1) or self.held_out_size < 0:
            raise ValueError(f"expected size >= 1 (or null) and held_out_size >= 0, got {self.size} "
                             f"and {self.held_out_size}")
        if self.server_start_timeout_s <= 0:
            raise ValueError("expected server_start_timeout_s > 0")
        reserved = {"harness", "runtime"} & set(self.agent)
        if reserved:
            raise ValueError(f"agent: set {', '.join(sorted(reserved))} with the parameter of that name, "
                             "not inside agent")
        # without verifiers the library check that follows names the extra to install
        if importlib.util.find_spec("verifiers") is not None and not environment_found(self.id):
            listed = ", ".join(installed_environments()) or "none"
            raise ValueError(f"id: no installed verifiers environment {self.id!r} (module "
                             f"{module_of(self.id)!r}; installed: {listed}); a verifiers environment is "
                             "a module exporting one vf.Taskset: pip install the package that ships it")
