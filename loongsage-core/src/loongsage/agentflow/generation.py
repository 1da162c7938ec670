"""One assistant turn against an engine: tokens in, incremental text and the finished turn out.

This is the only module that knows the engine client's shape
(``loongsage.engines.client.EngineClient``: ``agenerate`` returns the whole output,
``astream_generate`` yields chunks of new tokens, ``aabort`` cancels by ``rid``). Every token
carries the weight version that sampled it when the engine reports one per token (the embedded
engine does, streamed or not), else its output's or chunk's version. Both calls append to a
``Generated``, so a turn continued after a partial-rollout abort or on another replica
(``agentflow.turns``) holds one token list across its engine requests. Text is decoded
incrementally from the ids (never from engine text), held back while it ends in an incomplete
UTF-8 sequence, and split by the request's tool parser, so streaming and non-streaming
replies carry the same content, tool calls and tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from loongsage.agentflow.errors import EngineError
from loongsage.agentflow.tool_calls import ParsedOutput, StreamSplitter, ToolParser


@dataclass
class Generated:
    """The sampled tokens of one turn with their logprobs and weight versions."""

    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str = "stop"
    routed_experts: Any = None  # MoE: [prompt + output tokens, layers, top_k] (engines.routing)


def _version(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _absorb(out: Any, gen: Generated) -> None:
    """Append an engine output (a whole one, or a stream chunk of new tokens) to ``gen``."""
    ids = list(out.output_ids or [])
    lps = list(out.output_logprobs or [])
    if len(lps) != len(ids):
        raise EngineError(f"engine returned {len(ids)} tokens but {len(lps)} logprobs")
    per_token = getattr(out, "output_weight_versions", None)
    versions = [_version(v) for v in per_token] if per_token and len(per_token) == len(ids) else \
        [_version(out.weight_version)] * len(ids)
    gen.output_ids.extend(ids)
    gen.logprobs.extend(float(x) for x in lps)
    gen.versions.extend(versions)
    if out.finish_reason:
        gen.finish_reason = str(out.finish_reason)
    if getattr(out, "routed_experts", None) is not None:
        gen.routed_experts = out.routed_experts


class TurnDecoder:
    """Incremental detokenisation + tool-call splitting for one turn."""

    def __init__(self, tokenizer: Any, parser: ToolParser) -> None:
        self.tokenizer = tokenizer
        self.splitter = StreamSplitter(parser)
        self.text = ""

    def update(self, ids: list[int], final: bool = False) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if text.endswith("\ufffd") and not final:
            return ""
        piece, self.text = text[len(self.text):], text
        return self.splitter.feed(piece)

    def finish(self, ids: list[int]) -> tuple[str, ParsedOutput]:
        tail = self.update(ids, final=True)
        rest, parsed = self.splitter.finish()
        return tail + rest, parsed

    def stop_text(self, gen: Generated) -> str:
        """The special token that ended the turn ('' when it ended any other way)."""
        if gen.finish_reason != "stop" or not gen.output_ids:
            return ""
        last = gen.output_ids[-1]
        return self.tokenizer.decode([last]) if last in set(self.tokenizer.all_special_ids) else ""


async def stream_generation(client: Any, input_ids: list[int], sampling: dict[str, Any], rid: str,
                            decoder: TurnDecoder, gen: Generated) -> AsyncIterator[str]:
    """Stream content pieces; ``gen`` holds the sampled tokens when the iterator ends."""
    async for out in client.astream_generate(input_ids, sampling, rid=rid):
        _absorb(out, gen)
        piece = decoder.update(gen.output_ids)
        if piece:
            yield piece


async def generate(client: Any, input_ids: list[int], sampling: dict[str, Any],
                   rid: str, gen: Generated) -> None:
    """Append one whole engine output to ``gen``."""
    _absorb(await client.agenerate(input_ids, sampling, rid=rid), gen)


async def abort(client: Any, rid: str) -> None:
    await client.aabort(rid)
