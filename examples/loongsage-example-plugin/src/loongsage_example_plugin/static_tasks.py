"""An environment of fixed tasks: one chat call per episode through the run's router, scored by
exact match, to show the environment contract."""

import asyncio
import json
import urllib.request

from loongsage.plugin import Episode
from loongsage_example_plugin.exact_match import exact_match
from loongsage_example_plugin.fixed_list import FixedList


class StaticTasks:
    """Its tasks are a ``fixed_list`` (the same for both splits); the episode asks the policy once."""

    def __init__(self, params, context):
        self.params = params
        self.seed = context.seed if context is not None else 0
        self.source = context.source if context is not None else "static_tasks"

    def tasks(self, split):
        return FixedList(self.params, self.seed, source=self.source)

    async def run_episode(self, task, endpoint):
        answer = await asyncio.to_thread(_chat, endpoint, task.messages)
        scored = exact_match(answer, task.ground_truth, self.params)
        return Episode(reward=scored["score"], metrics={"answered": float(scored["answered"])}, text=answer)


def _chat(endpoint, messages):
    """One Chat Completions call to the router (OpenAI wire format)."""
    body = json.dumps({"model": endpoint.model, "messages": messages, **endpoint.sampling}).encode()
    request = urllib.request.Request(f"{endpoint.urls['openai'].rstrip('/')}/chat/completions", data=body,
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {endpoint.api_key}"})
    with urllib.request.urlopen(request) as response:
        return json.load(response)["choices"][0]["message"]["content"] or ""
