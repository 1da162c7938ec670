"""The ``openenv`` environment: multi-turn episodes on an OpenEnv server, the loop run here.

OpenEnv (github.com/meta-pytorch/OpenEnv) environments hold no model: the trainer owns the loop.
An episode opens one WebSocket session on the server (an installed environment started as a
local process, or a given ``url``), resets it with the task's seed, and then, until the
environment says ``done`` or ``max_turns`` replies were made: the observation becomes a user
turn, sent with the conversation so far to the policy through the trajectory's router URL (so
every model call is recorded token-exactly like any agent's), and the reply is parsed into an
action: the first JSON object in it. The server checks the action against its type; a reply
with no JSON object, or one the server refuses (pydantic's errors), is answered with the
error as the next user turn and counted (``invalid_actions``), without a step. The episode's
return is the sum of the step rewards the server reported.

Tasks are reset seeds: training episode i resets with ``seed + i``, held-out episode i with
``held_out_seed + i`` (default ``seed + size``, so the two never share a seed). The policy is
told the action's JSON schema (``GET /schema``) in the system prompt.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from loongsage.plugin import Endpoint, EnvironmentContext, Episode, Prompt

from loongsage_agents.agents.chat import openai_client
from loongsage_agents.environments.openenv_params import SCHEMA_SLOT, OpenEnvParams
from loongsage_agents.environments.openenv_server import (EnvSession, InvalidAction, LocalServer,
                                                          action_schema)


def parse_action(text: str) -> dict[str, Any]:
    """The first JSON object in a reply (bare, fenced or inside prose); ``InvalidAction`` if none."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    raise InvalidAction("the reply holds no JSON object")


def invalid_turn(error: InvalidAction) -> str:
    """The user turn that answers an invalid action."""
    return f"Invalid action ({error}). Reply with exactly one JSON object matching the action schema."


class SeedList:
    """One split's tasks: episode ``i`` resets the environment with seed ``first + i``."""

    def __init__(self, split: str, first: int, size: int, name: str) -> None:
        self.split, self.first, self.size, self.name = split, first, size, name

    def __len__(self) -> int:
        return self.size

    def get(self, index: int) -> Prompt:
        seed = self.first + index
        return Prompt(source="", index=index,
                      messages=[{"role": "user", "content": f"{self.name} episode (reset seed {seed})"}],
                      metadata={"reset_seed": seed, "split": self.split})


class OpenEnvEnvironment:
    """An OpenEnv server's episodes, multi-turn, one WebSocket session each."""

    def __init__(self, params: OpenEnvParams, context: EnvironmentContext) -> None:
        self.params = params
        self.context = context
        self.name = params.env or params.url
        self._server: LocalServer | None = None
        self._ready: tuple[str, str] | None = None  # (base URL, system prompt)
        self._lock: asyncio.Lock | None = None

    def tasks(self, split: str) -> SeedList:
        p = self.params
        if split == "train":
            return SeedList(split, p.seed, p.size, self.name)
        first = p.seed + p.size if p.held_out_seed is None else p.held_out_seed
        return SeedList(split, first, p.held_out_size, self.name)

    async def ready(self) -> tuple[str, str]:
        """The server's base URL and the system prompt with its action schema (started once)."""
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            if self._ready is None:
                url = self.params.url
                if url is None:
                    self._server = self._server or LocalServer(self.params.env)
                    await asyncio.to_thread(self._server.wait_healthy, self.params.server_start_timeout_s)
                    url = self._server.url
                schema = json.dumps(await asyncio.to_thread(action_schema, url))
                self._ready = url, self.params.system_prompt.replace(SCHEMA_SLOT, schema)
        return self._ready

    def render(self, observation: dict[str, Any]) -> str:
        """An observation as the text of a user turn."""
        field = self.params.observation_field
        if field is None:
            return json.dumps(observation, ensure_ascii=False)
        return str(observation.get(field, ""))

    async def run_episode(self, task: Prompt, endpoint: Endpoint) -> Episode:
        url, system = await self.ready()
        seed = task.metadata["reset_seed"]
        rewards: list[float] = []
        invalid = turns = 0
        text = ""
        async with EnvSession(url, self.params.step_timeout_s) as env, \
                openai_client(dict(endpoint.urls), endpoint.api_key) as client:
            result = await env.reset(seed=seed, **self.params.reset_args)
            messages = [{"role": "system", "content": system},
                        {"role": "user", "content": self.render(result.observation)}]
            done = result.done
            while not done and turns < self.params.max_turns:
                reply = await client.chat.completions.create(model=endpoint.model, messages=messages,
                                                             **dict(endpoint.sampling))
                turns += 1
                text = reply.choices[0].message.content or ""
                messages.append({"role": "assistant", "content": text})
                try:
                    result = await env.step(parse_action(text))
                except InvalidAction as err:
                    invalid += 1
                    messages.append({"role": "user", "content": invalid_turn(err)})
                    continue
                rewards.append(result.reward or 0.0)
                done = result.done
                messages.append({"role": "user", "content": self.render(result.observation)})
        metrics = {"invalid_actions": float(invalid), "turns": float(turns), "steps": float(len(rewards)),
                   "done": float(done)}
        return Episode(reward=sum(rewards), metrics=metrics, text=text,
                       info={"reset_seed": seed, "step_rewards": rewards, "invalid_actions": invalid,
                             "done": done})
