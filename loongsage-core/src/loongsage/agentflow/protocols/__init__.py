"""Wire adapters: each turns one API's requests into a ``ChatRequest`` and renders replies back."""

from loongsage.agentflow.protocols.anthropic_messages import AnthropicMessagesAdapter
from loongsage.agentflow.protocols.base import StreamEvent, TurnResult, WireAdapter
from loongsage.agentflow.protocols.openai_chat import OpenAIChatAdapter
from loongsage.agentflow.protocols.openai_responses import OpenAIResponsesAdapter

ADAPTERS: dict[str, WireAdapter] = {
    "chat/completions": OpenAIChatAdapter(),
    "responses": OpenAIResponsesAdapter(),
    "messages": AnthropicMessagesAdapter(),
}

__all__ = ["ADAPTERS", "AnthropicMessagesAdapter", "OpenAIChatAdapter", "OpenAIResponsesAdapter",
           "StreamEvent", "TurnResult", "WireAdapter"]
