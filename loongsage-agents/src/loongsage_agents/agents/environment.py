"""The ``environment`` agent: runs a data source's environment episodes through the router.

A source that names an environment (``data_sources[i].environment``) gets this agent bound to it
by config validation; the built environment arrives in the
agent's ``SourceContext.environment``. Each trajectory of a group is one episode:
``environment.run_episode(prompt, endpoint)`` with the trajectory's own router URLs and key, so
every model call the environment's code makes is recorded token-exactly like any agent's, under
``episode_timeout_s``. The episode's reward and metrics travel in the sample's ``reward_info``
(``episode_reward``, ``episode_metrics``) to the source's reward, ``episode_reward``.

An episode that raises (the environment's own error, a scorer that crashed) or runs past its
deadline ends its trajectory as failed (``reward_info["failed"]`` naming why), with the turns it
recorded: ``rollout.failed_trajectory`` decides what happens to it and the run goes on. A model
call the router failed is handled by ``RouterAgentBase`` as for every router-based agent.
"""

from __future__ import annotations

import asyncio
from typing import Any

from loongsage.plugin import Endpoint, Prompt

from loongsage_agents.agents.chat import chat_sampling
from loongsage_agents.agents.router_base import Outcome, RouterAgentBase, described, failed_model_call
from loongsage_agents.agents.router_params import EnvironmentAgentParams


class EnvironmentAgent(RouterAgentBase):
    """One episode of the source's environment per trajectory, against that trajectory's router URL."""

    params_type = EnvironmentAgentParams

    def __init__(self, params: EnvironmentAgentParams | None, context: Any) -> None:
        super().__init__(params, context)
        self.environment = getattr(context, "environment", None) if context is not None else None

    async def run_trajectory(self, prompt: Prompt, urls: dict[str, str], key: str,
                             sampling_params: dict[str, Any]) -> Outcome:
        if self.environment is None:
            raise RuntimeError("the environment agent runs only for a source that names an environment")
        endpoint = Endpoint(urls=dict(urls), api_key=key, model=self.params.served_model_names[0],
                            sampling=chat_sampling(sampling_params))
        timeout = self.params.episode_timeout_s
        try:
            episode = await asyncio.wait_for(self.environment.run_episode(prompt, endpoint), timeout)
        except asyncio.TimeoutError:
            return Outcome(info={"episode_failed": f"timed out after {timeout:g} s (episode_timeout_s)"})
        except Exception as exc:  # noqa: BLE001 - the episode's own failure: marked, counted, the run goes on
            if failed_model_call(exc, urls["openai"]):
                raise  # the router failed the turn: RouterAgentBase marks it as for every agent
            return Outcome(info={"episode_failed": described(exc)})
        info = {**episode.info, "episode_reward": float(episode.reward),
                "episode_metrics": {k: float(v) for k, v in episode.metrics.items()}}
        return Outcome(text=episode.text, info=info)
