"""The scheduler protocol the controller drives, and the window-policy factory.

Each step the controller calls ``next_batch(step)``, trains on the groups, syncs weights
and calls ``on_weights_updated(new_version)``. The synchronous scheduler and
``AsyncScheduler`` both implement this protocol, so a config switch (``async.enable``)
picks one without changing the loop.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Protocol

from loongsage.data.types import Group
from loongsage.runtime.window import WindowPolicy


class Scheduler(Protocol):
    def next_batch(self, step: int) -> list[Group]: ...

    def on_weights_updated(self, version: int) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def close(self) -> None: ...


def build_window_policy(ref: Any, registries: Optional[Any] = None) -> WindowPolicy:
    """Instantiate ``async.window_policy`` (a name, or ``{name: ..., **params}``).

    Parameters are validated by the policy's registered dataclass; errors name the key.
    """
    if registries is None:
        from loongsage.plugins import get_registries

        registries = get_registries()
    values = {"name": ref} if isinstance(ref, str) else dict(_plain(ref))
    if "name" not in values:
        raise ValueError(f"async.window_policy: expected a name or a mapping with 'name', got {ref!r}")
    name = values.pop("name")
    entry = registries.window_policy.entry(name, "async.window_policy.name")
    params = entry.build_params(values, "async.window_policy")
    policy = entry.obj(params)
    if not isinstance(policy, WindowPolicy):
        raise TypeError(
            f"async.window_policy: '{name}' from '{entry.distribution}' built a "
            f"{type(policy).__name__}, expected a subclass of loongsage.runtime.window.WindowPolicy"
        )
    return policy


def _plain(ref: Any) -> Mapping[str, Any]:
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(ref, DictConfig):
            return OmegaConf.to_container(ref, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a core dependency
        pass
    return ref


def async_scheduler_from_config(
    cfg: Any,
    *,
    prompt_source: Any,
    rollout_group: Any,
    abort_inflight: Any = None,
    registries: Optional[Any] = None,
    version: int = 0,
) -> Any:
    """Build the ``AsyncScheduler`` a validated config asks for.

    Reads ``async.window_policy``, ``async.stale_steps``, ``rollout.prompts_per_step``,
    ``rollout.oversample_groups`` and ``rollout.partial``; per-source quotas come from
    ``prompt_source.quotas`` when it has them (``BatchedPromptSource``). Without
    ``async.enable`` (colocated + partial rollout) the window is synchronous, ``S = 0``:
    ``async.stale_steps`` (default 1) would otherwise double what each rollout phase
    generates; ``rollout.oversample_groups`` sets the extra groups there.
    """
    from loongsage.runtime.async_scheduler import AsyncScheduler

    section = cfg["async"]
    return AsyncScheduler(
        build_window_policy(section.window_policy, registries),
        prompt_source,
        rollout_group,
        cfg.rollout.prompts_per_step,
        section.stale_steps if section.enable else 0,
        quotas=getattr(prompt_source, "quotas", None),
        oversample=cfg.rollout.oversample_groups,
        partial=cfg.rollout.partial,
        abort_inflight=abort_inflight,
        version=version,
    )
