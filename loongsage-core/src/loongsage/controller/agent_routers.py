"""One AgentFlow router per data source whose agent talks to the policy through a router.

An agent that has ``use_router(router)`` and ``router_settings()`` (every router-based agent
of loongsage-agents) would otherwise build a private router per engine client and keep its
trajectories in memory only. In a training run the controller instead starts one router per
such source over *all* rollout engines (sticky per trajectory, least-loaded across
replicas), built with the agent's own settings (a CLI's untrained title model, its tool
parser, its middlewares), and persists every finished trajectory to
``<run_dir>/trajectories/<source>/trajectories.jsonl``: the flat token arrays, loss mask,
logprobs, weight versions and segments, so any trained sample can be traced back to the
conversation that produced it. One router per source, not one for all, because settings
differ between agents and each file then has one writer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence


def uses_router(agent: Any) -> bool:
    return hasattr(agent, "use_router") and hasattr(agent, "router_settings")


class AgentRouters:
    """The started routers of a run's router-based agents; ``close()`` stops them all."""

    def __init__(self, sources: Mapping[str, Any], clients: Sequence[Any], tokenizer: Any,
                 run_dir: Path) -> None:
        from loongsage.agentflow.server import Router

        self.routers: dict[str, Any] = {}
        self.agents: list[Any] = []
        try:
            for name, source in sources.items():
                agent = source.agent
                if not uses_router(agent):
                    continue
                settings = agent.router_settings()
                settings.run_dir = str(Path(run_dir) / "trajectories" / name)
                router = Router(list(clients), tokenizer, settings)
                router.start()
                self.routers[name] = router
                agent.use_router(router)
                self.agents.append(agent)
        except BaseException:
            self.close()
            raise

    def urls(self) -> dict[str, str]:
        """Each source's router base URL (for inspecting trajectories while a run is live)."""
        return {name: router.url for name, router in self.routers.items()}

    def close(self) -> None:
        for agent in self.agents:
            agent.close()
        for router in self.routers.values():
            router.stop()
        self.routers.clear()
        self.agents.clear()
