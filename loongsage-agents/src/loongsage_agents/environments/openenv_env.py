"""The ``openenv`` environment: multi-turn episodes on an OpenEnv server, the loop run here.

OpenEnv (github.com/meta-pytorch/OpenEnv) environments hold no model: the trainer owns the loop.
An episode opens one WebSocket session on the server (an installed environment started as a
local process, or a given ``url``), resets it with the task's seed, and then, until the
environment says ``done`` or ``max_turns`` replies were made: the observation becomes a user
turn, sent with the conversation so far to the policy through the trajectory's router URL (so
every model call is recorded token-exactly like any agent's), and the reply is parsed into an
action: the first JSON object in it (``action_format: json``), or the arguments of its one call
of the tool ``act`` whose parameters are the action's schema (``tool_call``; its result is the
next observation). The server checks the action against its type; a reply with no action, or
one the server refuses (pydantic's errors), is answered with the error as the next turn and
counted (``invalid_actions``), without a step. The episode's return is the sum of the step
rewards the server reported.

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


TOOL = "act"  # the one tool of action_format tool_call


class JsonActions:
    """An action is the first JSON object of the reply's text; observations are user turns."""

    system_prompt = ("You act in an environment. Each user message is its observation. Reply with "
                     "exactly one JSON object, the next action, matching this JSON schema:\n" + SCHEMA_SLOT)
    retry = "Reply with exactly one JSON object matching the action schema."

    def request(self, schema: dict[str, Any]) -> dict[str, Any]:
        return {}

    def assistant(self, message: Any) -> dict[str, Any]:
        return {"role": "assistant", "content": message.content or ""}

    def action(self, message: Any) -> dict[str, Any]:
        return parse_action(message.content or "")

    def answers(self, message: Any, content: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": content}]


class ToolCallActions(JsonActions):
    """An action is the arguments of the reply's one call of ``act``; its result the observation."""

    system_prompt = ("You act in an environment. The user message is its first observation. Take each "
                     f"action by calling the tool {TOOL} once; its result is the next observation.")
    retry = f"Call the tool {TOOL} once, with the action as its arguments."

    def request(self, schema: dict[str, Any]) -> dict[str, Any]:
        return {"tools": [{"type": "function", "function": {
            "name": TOOL, "description": "Take the next action in the environment.", "parameters": schema}}]}

    def assistant(self, message: Any) -> dict[str, Any]:
        calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                                "arguments": c.function.arguments}}
                 for c in message.tool_calls or []]
        return {**super().assistant(message), **({"tool_calls": calls} if calls else {})}

    def action(self, message: Any) -> dict[str, Any]:
        calls = list(message.tool_calls or [])
        if len(calls) != 1 or calls[0].function.name != TOOL:
            names = [c.function.name for c in calls]
            raise InvalidAction(f"expected one call of the tool {TOOL}, got {len(calls)} ({', '.join(names)})"
                                if calls else f"the reply calls no tool; expected one call of {TOOL}")
        try:
            arguments = json.loads(calls[0].function.arguments or "{}")
        except json.JSONDecodeError as err:
            raise InvalidAction(f"the arguments of {TOOL} are not JSON: {err}") from None
        if not isinstance(arguments, dict):
            raise InvalidAction(f"the arguments of {TOOL} are not a JSON object")
        return arguments

    def answers(self, message: Any, content: str) -> list[dict[str, Any]]:
        calls = list(message.tool_calls or [])
        if not calls:
            return super().answers(message, content)
        return [{"role": "tool", "tool_call_id": c.id, "content": content} for c in calls]


ACTIONS: dict[str, JsonActions] = {"json": JsonActions(), "tool_call": ToolCallActions()}


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
        self._ready: tuple[str, str, dict[str, Any]] | None = None  # what ready() returns
        self._lock: asyncio.Lock | None = None
        self.actions = ACTIONS[params.action_format]

    def tasks(self, split: str) -> SeedList:
        p = self.params
        if split == "train":
            return SeedList(split, p.seed, p.size, self.name)
        first = p.seed + p.size if p.held_out_seed is None else p.held_out_seed
        return SeedList(split, first, p.held_out_size, self.name)

    async def ready(self) -> tuple[str, str, dict[str, Any]]:
        """The server's base URL, the system prompt and the request's extra fields (its tools),
        with the server's action schema (started once)."""
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            if self._ready is None:
                url = self.params.url
                if url is None:
                    self._server = self._server or LocalServer(self.params.env)
                    await asyncio.to_thread(self._server.wait_healthy, self.params.server_start_timeout_s)
                    url = self._server.url
                schema = await asyncio.to_thread(action_schema, url)
                system = self.params.system_prompt or self.actions.system_prompt
                system = system.replace(SCHEMA_SLOT, json.dumps(schema))
                self._ready = url, system, self.actions.request(schema)
        return self._ready

    def render(self, observation: dict[str, Any]) -> str:
        """An observation as the text of a user turn."""
        field = self.params.observation_field
        if field is None:
            return json.dumps(observation, ensure_ascii=False)
        if field not in observation:
            raise RuntimeError(f"observation_field {field!r} is not a field of the observation "
                               f"(fields: {', '.join(observation)})")
        return str(observation[field])

    async def run_episode(self, task: Prompt, endpoint: Endpoint) -> Episode:
        url, system, request = await self.ready()
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
                                                             **request, **dict(endpoint.sampling))
                turns += 1
                message = reply.choices[0].message
                text = message.content or ""
                messages.append(self.actions.assistant(message))
                try:
                    result = await env.step(self.actions.action(message))
                except InvalidAction as err:
                    invalid += 1
                    messages += self.actions.answers(message, f"Invalid action ({err}). {self.actions.retry}")
                    continue
                rewards.append(result.reward or 0.0)
                done = result.done
                messages += self.actions.answers(message, self.render(result.observation))
        metrics = {"invalid_actions": float(invalid), "turns": float(turns), "steps": float(len(rewards)),
                   "done": float(done)}
        # the reset seed is the prompt's metadata; numbers in info would be logged as metrics again
        return Episode(reward=sum(rewards), metrics=metrics, text=text, info={"step_rewards": rewards})
