"""One AgentFlow router per data source whose agent talks to the policy through a router.

An agent that has ``use_router(router)`` and ``router_settings(base)`` (every router-based
agent of loongsage-agents) would otherwise build a private router per engine client and
keep its trajectories in memory only. In a training run the controller instead starts one
router per such source over the run's engine pool (sticky per trajectory, least-loaded
across replicas, in-flight counts shared with every other rollout), with the run's
``agentflow`` settings plus the agent's own (its served and untrained model names, its
middlewares after the run's), and persists every finished trajectory to
``<run_dir>/trajectories/<source>/trajectories.jsonl``: the flat token arrays, loss mask,
logprobs, weight versions and segments, so any trained sample can be traced back to the
conversation that produced it. ``record_rewards`` appends each scored trajectory's reward
to ``rewards.jsonl`` beside it. One router per source, not one for all, because settings
differ between agents and each file then has one writer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from loongsage.agentflow.server import Router
from loongsage.agentflow.settings import RouterSettings
from loongsage.data.types import Sample
from loongsage.engines.pool import EnginePool


def uses_router(agent: Any) -> bool:
    return hasattr(agent, "use_router") and hasattr(agent, "router_settings")


class AgentRouters:
    """The started routers of a run's router-based agents; ``close()`` stops them all."""

    def __init__(self, sources: Mapping[str, Any], pool: EnginePool, tokenizer: Any,
                 base: RouterSettings, run_dir: Path) -> None:
        self.routers: dict[str, Router] = {}
        self.agents: list[Any] = []
        try:
            for name, source in sources.items():
                agent = source.agent
                if not uses_router(agent):
                    continue
                settings = agent.router_settings(base)
                settings.run_dir = str(Path(run_dir) / "trajectories" / name)
                router = Router(pool, tokenizer, settings)
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

    def record_rewards(self, source: str, samples: list[Sample]) -> None:
        """Persist the rewards of a source's scored samples beside their trajectories."""
        router = self.routers.get(source)
        if router is None:
            return
        recorded: set[tuple[str, str]] = set()
        for sample in samples:  # a trajectory's segments share one reward row
            key = (sample.reward_info.get("trajectory_id"), sample.reward_info.get("attempt_id", "0"))
            if key[0] is not None and key not in recorded:
                recorded.add(key)
                router.record_reward(sample)

    def close(self) -> None:
        for agent in self.agents:
            agent.close()
        for router in self.routers.values():
            router.stop()
        self.routers.clear()
        self.agents.clear()
