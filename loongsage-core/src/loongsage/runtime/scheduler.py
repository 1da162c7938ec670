"""The scheduler protocol the controller drives, and the window-policy factory.

Each step the controller calls ``next_batch(step)``, trains on the groups, syncs weights
and calls ``on_weights_updated(new_version)``. The synchronous scheduler and
``AsyncScheduler`` both implement this protocol, so a config switch (``async.enable``)
picks one without changing the loop.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

from loongsage.data.types import Group
from loongsage.registry import PluginRef
from loongsage.runtime.event_loop import EventLoopThread
from loongsage.runtime.window import WindowPolicy


class Scheduler(Protocol):
    def next_batch(self, step: int) -> list[Group]: ...

    def on_weights_updated(self, version: int) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def close(self) -> None: ...


def build_window_policy(ref: PluginRef) -> WindowPolicy:
    """Build the window policy ``async.window_policy`` resolved to (its params typed already)."""
    policy = ref.obj(ref.params)
    if not isinstance(policy, WindowPolicy):
        raise TypeError(
            f"{ref.key}: '{ref.name}' from '{ref.entry.distribution}' built a "
            f"{type(policy).__name__}, expected a subclass of loongsage.runtime.window.WindowPolicy"
        )
    return policy


def async_scheduler_from_config(
    cfg: Any,
    window_policy: PluginRef,
    *,
    prompt_source: Any,
    rollout_group: Any,
    abort_inflight: Any = None,
    resume_inflight: Any = None,
    continues_in_place: Any = None,
    version: int = 0,
    loop: Optional[EventLoopThread] = None,
) -> Any:
    """Build the ``AsyncScheduler`` a validated config asks for.

    Builds ``window_policy`` (the resolved ``async.window_policy``); reads
    ``async.stale_steps``, ``rollout.prompts_per_step``, ``rollout.oversample_groups`` and
    ``rollout.partial``; per-source quotas come from
    ``prompt_source.quotas`` when it has them (``BatchedPromptSource``). Without
    ``async.enable`` (colocated + partial rollout) the window is synchronous, ``S = 0``:
    ``async.stale_steps`` (default 1) would otherwise double what each rollout phase
    generates; ``rollout.oversample_groups`` sets the extra groups there.
    """
    from loongsage.runtime.async_scheduler import AsyncScheduler

    section = cfg["async"]
    return AsyncScheduler(
        build_window_policy(window_policy),
        prompt_source,
        rollout_group,
        cfg.rollout.prompts_per_step,
        section.stale_steps if section.enable else 0,
        quotas=getattr(prompt_source, "quotas", None),
        oversample=cfg.rollout.oversample_groups,
        partial=cfg.rollout.partial,
        abort_inflight=abort_inflight,
        resume_inflight=resume_inflight,
        continues_in_place=continues_in_place,
        version=version,
        loop=loop,
    )
