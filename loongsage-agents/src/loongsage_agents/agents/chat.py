"""White-box ``chat`` agent: one chat turn through the AgentFlow router with the openai SDK.

The same single turn as ``single_turn``, but the prompt goes through the router, so the
trajectory is recorded exactly as for any agent (TITO store, segments, persistence) and the
agent is a minimal example of an SDK-driven white-box loop. Sampling parameters map to the
Chat Completions fields: ``max_new_tokens`` → ``max_tokens``, ``temperature``, ``top_p``.

``openai_client`` is what every white-box agent here opens per trajectory: its HTTP client
reuses one TLS context for the process. The SDK's default builds a fresh one per client,
loading the system's CA bundle (about 24 ms of CPU each, measured): on the agentic recipe
that was 6 CPU-seconds of a 5-step run spent on the rollout's critical path, for loopback
URLs that never use TLS.
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

from loongsage.plugin import Prompt

from loongsage_agents.agents.router_base import Outcome, RouterAgentBase
from loongsage_agents.agents.router_params import ChatParams

SAMPLING_FIELDS = {"max_new_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p"}


def chat_sampling(sampling_params: dict[str, Any]) -> dict[str, Any]:
    """Engine sampling parameters as Chat Completions request fields (others are dropped)."""
    return {wire: sampling_params[name] for name, wire in SAMPLING_FIELDS.items()
            if sampling_params.get(name) is not None}


@functools.cache
def shared_tls_context() -> ssl.SSLContext:
    """The process's one verifying TLS context (CA bundle loaded once)."""
    return ssl.create_default_context()


def openai_client(urls: dict[str, str], key: str) -> Any:
    """An ``AsyncOpenAI`` for one trajectory's router URL and key (no SDK retries: the router
    retries engines itself), over an HTTP client that reuses ``shared_tls_context``."""
    import openai

    http = openai.DefaultAsyncHttpxClient(verify=shared_tls_context())
    return openai.AsyncOpenAI(base_url=urls["openai"], api_key=key, max_retries=0, http_client=http)


class ChatAgent(RouterAgentBase):
    """Send the prompt's messages once; the reply is the answer."""

    params_type = ChatParams

    async def run_trajectory(self, prompt: Prompt, urls: dict[str, str], key: str,
                             sampling_params: dict[str, Any]) -> Outcome:
        async with openai_client(urls, key) as client:
            reply = await client.chat.completions.create(
                model=self.params.served_model_names[0], messages=prompt.messages,
                **chat_sampling(sampling_params))
        choice = reply.choices[0]
        return Outcome(text=choice.message.content or "", info={"finish_reason": choice.finish_reason})
